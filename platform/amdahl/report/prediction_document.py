"""`platform predict`'s document: the step-time model's terms and leave-one-out caveat, then one
section per configuration family with its predicted throughput, speedup, efficiency and cost at
the device counts and batch sizes asked for (report/predict.py computes them), then the caveats
several families share, once.

Pure: imports neither ray nor torch.
"""

from __future__ import annotations

from amdahl.analysis.configs import NO_SYNC
from amdahl.analysis.prediction import FamilyPrediction, SweepPrediction
from amdahl.analysis.selfcheck import Extrapolation
from amdahl.report.document import Footnotes, Section, Table, mib, ms, pct, rate, times
from amdahl.report.model_sections import (
    BOUND_RULE,
    INTERVAL_HEADER,
    INTERVAL_RULE,
    MODEL_TEXT,
    failed_fit_notes,
    family_terms,
    interval_cell,
    links_text,
    loo_caveat,
    model_caveats,
)


def prediction_sections(pred: SweepPrediction) -> list[Section]:
    """`platform predict`: the model's terms and caveat, then one table per family."""
    head = Section("predict", f"PREDICTION for {pred.name}: step-time model, not measured")
    head.paras.append(MODEL_TEXT)
    head.paras.append(BOUND_RULE)
    head.paras.append(links_text(pred.model.comm))
    head.paras.append(loo_caveat(pred.loo))
    head.paras.append(extrapolation_text(pred.extrapolation, pred.extrapolations))
    head.paras.append(
        f"Each predicted throughput and step time comes with an 80% interval: {INTERVAL_RULE}."
    )
    head.paras.append(
        f"Devices spread over {pred.nodes} node(s). Speedup and efficiency divide by the "
        "family's measured 1-device throughput at the same batch, with the family's own sync "
        "(inside its wrapper: DDP's reducer runs on one device too; the model's where none was "
        "measured). Where the 1-device sync none run (no wrapper, as people train on one "
        "device) differs from it beyond the spread, a last column divides by that one."
    )
    if pred.price <= 0:
        head.paras.append(
            "Cost: no report.cost_per_device_hour in spec.yaml, so device-hours per million "
            "samples instead of $."
        )
    head.bullets = failed_fit_notes(pred.model) + list(pred.notes) + model_caveats(pred.model)
    cost = "predicted $/M samples" if pred.price > 0 else "predicted device-h/M samples"
    caveats = [_family_caveats(fp) for fp in pred.families]
    shared = _shared(caveats)
    notes = Footnotes(shared)
    sections = [head]
    for i, (fp, own) in enumerate(zip(pred.families, caveats, strict=True)):
        sections.append(_family_section(i, fp, cost, _own_bullets(own, notes)))
    if shared:
        sections.append(_shared_section(notes, pred.families, caveats))
    return sections


def _family_caveats(fp: FamilyPrediction) -> list[str]:
    """The caveats a family's rows carry, each once, in the rows' order."""
    caveats: list[str] = []
    if fp.family.sync == NO_SYNC:
        caveats.append(
            "sync none is the no-communication ceiling (every worker trains alone), "
            "not a way to train"
        )
    for pr in fp.rows:
        caveats += [c for c in pr.prediction.caveats if c not in caveats]
    return caveats


def _shared(caveats: list[list[str]]) -> list[str]:
    """The caveats more than one family carries, in the order they first appear: printed once
    at the end, not in every family's section (the held-out evidence a caveat quotes runs to a
    paragraph, and every family extrapolating the same counts carries it)."""
    seen: list[str] = []
    for own in caveats:
        seen += [c for c in own if c not in seen]
    return [c for c in seen if sum(c in own for own in caveats) > 1]


def _own_bullets(own: list[str], shared: Footnotes) -> list[str]:
    """A family's caveats no other family carries, then the numbers of the shared ones it
    carries too."""
    bullets = [c for c in own if c not in shared.texts]
    numbers = shared.cite([c for c in own if c in shared.texts])
    if numbers:
        bullets.append(
            f"caveats shared with other families: {numbers}, under CAVEATS SHARED at the end"
        )
    return bullets


def _shared_section(
    shared: Footnotes, families: list[FamilyPrediction], caveats: list[list[str]]
) -> Section:
    """The caveats several families carry, numbered, each naming its families unless all."""
    sec = Section("predict-shared", "CAVEATS SHARED by the families above")
    for c in shared.texts:
        labels = [fp.family.label for fp, own in zip(families, caveats, strict=True) if c in own]
        whose = "" if len(labels) == len(families) else f"({', '.join(labels)}) "
        sec.bullets.append(f"{shared.number(c)} {whose}{c}")
    return sec


def _family_section(i: int, fp: FamilyPrediction, cost: str, bullets: list[str]) -> Section:
    """One family's predictions: throughput and cost per (devices, batch), then the predicted
    step's parts, then its caveats (`bullets`)."""
    fam = fp.family
    sec = Section(f"predict-{i}", f"PREDICTION (not measured): {fam.label}")
    sec.paras.append(family_terms(fam))
    rows, parts = [], []
    unwrapped = any(pr.unwrapped for pr in fp.rows)
    for pr in fp.rows:
        p = pr.prediction
        price = pr.cost
        rows.append(
            [
                str(pr.devices),
                str(pr.batch),
                rate(p.throughput),
                interval_cell(pr),
                times(pr.speedup) if pr.speedup else "n/a",
                pct(pr.efficiency),
                "n/a" if price is None else f"{price:,.3g}",
                mib(pr.memory_bytes),
                p.unknown or ("" if pr.baseline_measured else "1-device baseline predicted"),
            ]
        )
        if unwrapped:
            rows[-1].insert(-1, times(pr.speedup_unwrapped) if pr.speedup_unwrapped else "")
        if p.step_s is not None:
            steps = pr.step_s_range
            parts.append(
                [str(pr.devices), str(pr.batch), ms(p.step_s)]
                + [f"{ms(steps[0])} to {ms(steps[1])}" if steps else ""]
                + [ms(v) for v in (p.compute_s, p.comm_s, p.data_wait_s)]
            )
    batch = "global batch" if fam.scaling == "strong" else "batch/device"
    headers = ["devices", batch, "predicted samples/s", INTERVAL_HEADER, "predicted speedup"]
    headers += ["predicted efficiency", cost, "memory / device MiB"]
    headers += ["predicted speedup vs 1 device, no wrapper", "note"] if unwrapped else ["note"]
    if rows:
        sec.tables.append(Table(headers, rows, title="predicted, not measured"))
    else:
        sec.paras.append("No batch size to predict: the family has no ok run.")
    if parts:
        headers = ["devices", batch, "step ms", "80% interval step ms", "compute ms", "comm ms"]
        headers += ["data wait ms"]
        sec.tables.append(Table(headers, parts, title="predicted ms per optimizer step"))
    sec.bullets = bullets
    return sec


def extrapolation_text(ext: Extrapolation | None, checks: list[Extrapolation]) -> str:
    """What the sweep measured of the model's error beyond its fit, every distance it allows
    (`ext`, the headline: refitted without the widest count, predicting it)."""
    if not checks:
        return (
            "Beyond the widest measured device count the model's error is not measured (that "
            "needs ok runs at 1 and at least two more device counts): predictions out there "
            "are unchecked."
        )
    text = (
        "Beyond the widest measured device count: refitted without it, the model predicted "
        f"{ext.held_out} devices from fits up to {ext.fitted_max} with median error "
        f"{ext.median:.1%} (p90 {ext.p90:.1%}, {ext.points} configurations)"
        if ext
        else "Beyond the widest measured device count: no point there was predictable without it"
    )
    others = [c for c in checks if c is not ext]
    if others:
        text += "; the other checks the device counts allow: " + ", ".join(
            f"{c.fitted_max} -> {c.held_out} ({c.distance:.3g}x) {c.median:.1%}" for c in others
        )
    return (
        text + ". Each prediction beyond the measured counts quotes the check nearest at or "
        "beyond its distance; farther out than every check it quotes none (each was measured "
        "nearer), but says how far out it is and what was measured at that distance outside "
        "this sweep."
    )
