"""report.html's overview in a real browser, on a 128-configuration sweep: headless Chromium
lays the table out (every family a row, its sparkline drawn), a click on a header sorts it (up,
then down), and typing in the filter box hides the rows that do not match. A test-only script
appended to a copy of the report clicks and types like a user and records what the page shows.

Skipped when Chromium is not installed (CI installs Debian's `chromium`)."""

import html
import json

import pytest
from big_sweep_rows import BATCHES, PRECISIONS, PREFETCH, SYNCS, big_sweep_rows
from report_rows import write_sweep
from test_report_browser import CHROMIUM, _chromium

from amdahl.report import write_reports

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
FAMILIES = len(BATCHES) * len(PRECISIONS) * len(SYNCS) * len(PREFETCH)

#: Runs after the report's own script: the table as laid out, then as it reads after each
#: click and after typing into the filter.
PROBE = """<pre id="probe"></pre><script>
const table = document.getElementById('overview-table');
const heads = [...table.tHead.rows[0].cells];
const col = name => heads.findIndex(h => h.textContent.trim() === name);
const column = i => [...table.tBodies[0].rows].filter(r => !r.hidden)
  .map(r => r.cells[i].textContent.trim());
const click = name => { heads[col(name)].click();
  return {aria: heads[col(name)].getAttribute('aria-sort'), rank: column(col('#')),
          values: column(col(name))}; };
const box = table.getBoundingClientRect();
const sparks = [...table.querySelectorAll('svg.spark')].map(s => s.getBoundingClientRect().width);
const out = {width: box.width, height: box.height, rows: table.tBodies[0].rows.length,
             sparks: sparks.filter(w => w > 0).length, initial: column(col('#'))};
out.d2_up = click('d2 samples/s');
out.d2_down = click('d2 samples/s');
out.label_up = click('configuration');
const filter = document.getElementById('overview-filter');
filter.value = 'local_sgd P4';
filter.dispatchEvent(new Event('input'));
out.filtered = column(col('configuration'));
out.count = document.getElementById('overview-count').textContent;
document.getElementById('probe').textContent = JSON.stringify(out);
</script>"""


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("", "n/a", "oom") else float("nan")


def test_the_overview_of_128_configurations_renders_sorts_and_filters(tmp_path):
    rows = big_sweep_rows()
    report = write_reports(write_sweep(tmp_path / "sweep", rows))["html"]
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    browser = tmp_path / "browser"
    browser.mkdir()

    dom = _chromium(browser, "--window-size=1200,2000", "--dump-dom", probed.as_uri()).stdout
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    probe = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))

    # Rendered: every family a row, laid out, each one with an ok run drawn as a sparkline.
    assert probe["rows"] == FAMILIES
    assert probe["width"] > 600 and probe["height"] > 100
    assert probe["sparks"] == FAMILIES - 1  # the family that ran out of memory has none
    assert probe["initial"] == [str(i) for i in range(1, FAMILIES + 1)]

    # A click sorts by the column, ascending; a second click, descending; blanks stay last.
    up, down = probe["d2_up"], probe["d2_down"]
    assert up["aria"] == "ascending" and down["aria"] == "descending"
    measured = [_number(v) for v in up["values"] if v != "oom"]
    assert measured == sorted(measured) and up["values"][-1] == "oom"
    measured = [_number(v) for v in down["values"] if v != "oom"]
    assert measured == sorted(measured, reverse=True) and down["values"][-1] == "oom"
    assert sorted(up["rank"], key=int) == probe["initial"]  # the same rows, reordered
    d2 = {
        r["throughput"]
        for r in rows
        if r["devices"] == 2 and r["status"] == "ok"  # what the table was built from
    }
    assert {round(_number(v)) for v in up["values"] if v != "oom"} == {round(x) for x in d2}

    # Text columns sort with numbers inside compared as numbers: b32 < b64 < b128 < b256.
    batches = [int(v.split()[0][1:]) for v in probe["label_up"]["values"]]
    assert batches == sorted(batches) and batches[0] == 32 and batches[-1] == 256

    # The filter keeps rows holding every word typed, case-insensitively.
    expected = len(BATCHES) * len(PRECISIONS)
    assert len(probe["filtered"]) == expected
    assert all("local_sgd" in v and v.endswith(" p4") for v in probe["filtered"])
    assert probe["count"] == f"{expected} of {FAMILIES} shown"
