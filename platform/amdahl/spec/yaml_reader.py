"""The hardened YAML reader of sweep files: PyYAML's safe loader, with line numbers.

A key given twice in one mapping, a recursive anchor and aliases that expand a short file to
billions of values are refused with the line they are on (YamlProblem); anything else PyYAML or
its constructors raise is one of YAML_ERRORS. `line_numbers` maps each dotted path of the document
to its line, so amdahl.spec.load can name the line of a bad value. Pure: imports neither ray nor
torch.
"""

from __future__ import annotations

from typing import Any

import yaml

#: What parsing a YAML text can raise besides YamlProblem: PyYAML's own errors, ValueError for
#: a date such as 2024-13-01, RecursionError for nesting deeper than Python's stack.
YAML_ERRORS = (yaml.YAMLError, ValueError, OverflowError, RecursionError)
#: Most nodes a document may expand to through its aliases ("billion laughs" documents).
_MAX_YAML_NODES = 100_000
_MERGE_TAG = "tag:yaml.org,2002:merge"


class YamlProblem(yaml.YAMLError):
    """A YAML document PyYAML accepts but a sweep file must not be: `line` is 1-based."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line, self.message = line, message


class _SweepLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping. YAML requires unique
    keys, but PyYAML keeps the last one silently, so a second `grid:` replaced the first.
    Keys that a `<<` merge brings in may still be overridden, as YAML allows."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE_TAG:
                    continue
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: SafeLoader refuses it itself
                if first is not None:
                    raise YamlProblem(
                        line,
                        f"duplicate key {key!r} (first on line {first}); a key may appear "
                        "only once in a mapping: merge the two into one",
                    )
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """The document's node graph and its Python value, through _SweepLoader, after refusing
    recursive and exponentially expanding aliases (_check_aliases)."""
    loader = _SweepLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        _check_aliases(node)
        try:
            return node, loader.construct_document(node)
        except yaml.YAMLError:
            raise
        except Exception as e:  # PyYAML's constructors fail raw on some explicit tags
            raise yaml.YAMLError(  # (`!!timestamp ''`: AttributeError; `!!int x`: ValueError)
                f"cannot build a value ({type(e).__name__}: {e}); quote it if it is text, or "
                "fix its explicit !!tag"
            ) from None
    finally:
        loader.dispose()


def _check_aliases(root: yaml.Node) -> None:
    """An alias names a node, so a node holding an alias of itself (`a: &x [*x]`) is a cycle,
    which gave a RecursionError traceback; and aliases of aliases can expand a short file to
    billions of nodes. Both are refused, naming the line."""
    count = 0
    ancestors: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, True)]
    while stack:
        node, entering = stack.pop()
        if not entering:
            ancestors.discard(id(node))
            continue
        line = node.start_mark.line + 1
        if id(node) in ancestors:
            raise YamlProblem(
                line,
                "this node contains an alias of itself (a recursive anchor); an alias "
                "(*name) may only repeat a node defined before and outside it",
            )
        count += 1
        if count > _MAX_YAML_NODES:
            raise YamlProblem(
                line,
                f"the document's aliases expand to over {_MAX_YAML_NODES:,} values; a sweep "
                "file is far smaller: repeat fewer aliases",
            )
        if isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        else:
            continue
        ancestors.add(id(node))
        stack.append((node, False))
        stack += [(child, True) for child in reversed(children)]


def yaml_error_text(error: BaseException) -> str:
    """One of YAML_ERRORS as the text of a message (a RecursionError says nothing itself)."""
    if isinstance(error, RecursionError):
        return "nested too deeply"
    return str(error)


def line_numbers(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
    """Map each dotted path in the YAML document to its 1-based line number."""
    out: dict[tuple[str | int, ...], int] = {}

    def walk(n: yaml.Node, path: tuple[str | int, ...]) -> None:
        out[path] = n.start_mark.line + 1
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                walk(v, (*path, k.value))
                out[(*path, k.value)] = k.start_mark.line + 1  # the key's line, not the value's
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                walk(v, (*path, i))

    if node is not None:
        walk(node, ())
    return out
