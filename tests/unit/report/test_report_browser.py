"""The HTML report in a real browser: headless Chromium lays out every plot (checked from the
DOM) and paints it (checked in a screenshot: each plot's region is not blank).

Skipped when Chromium is not installed (CI installs Debian's `chromium`)."""

import html
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from report_rows import row, scaling_rows, write_sweep

from amdahl.report import write_reports

CHROMIUM = "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else shutil.which("chromium")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"
)
WIDTH = 1200
#: Appended to a copy of the report only: records where each plot landed and what it drew.
PROBE = """<pre id="probe"></pre><script>
const plots = [...document.querySelectorAll('svg.plot')].map(svg => {
  const r = svg.getBoundingClientRect();
  const marks = [...svg.querySelectorAll('.data')].filter(e => {
    const b = e.getBBox(); return b.width > 0 || b.height > 0; });
  const boxes = marks.map(e => e.getBoundingClientRect());
  const x0 = Math.min(...boxes.map(b => b.left)), x1 = Math.max(...boxes.map(b => b.right));
  const y0 = Math.min(...boxes.map(b => b.top)), y1 = Math.max(...boxes.map(b => b.bottom));
  return {id: svg.dataset.plot, x: r.left + scrollX, y: r.top + scrollY,
          w: r.width, h: r.height, drawn: marks.length,
          marks: [x0 + scrollX, y0 + scrollY, x1 - x0, y1 - y0]};
});
document.getElementById('probe').textContent = JSON.stringify(
  {plots: plots, height: document.documentElement.scrollHeight});
</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / f"profile-{len(list(tmp.iterdir()))}"
    profile.mkdir()
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--user-data-dir={profile}",
        *args,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _decode_png(data: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, bytes per pixel, unfiltered rows) of an 8-bit RGB/RGBA PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw, stride = zlib.decompress(idat), width * bpp
    out, prev = bytearray(), bytearray(stride)
    for y in range(height):
        f, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride if f else 0):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else b if pb <= pc else c
                line[i] = (line[i] + pred) & 255
        out += line
        prev = line
    return width, height, bpp, bytes(out)


def _region_stats(png, x, y, w, h) -> tuple[float, int]:
    """(share of non-white pixels, count of coloured pixels) inside a rectangle, sampling every
    second column. Coloured = saturated (data series), unlike the grey axes, grid and text."""
    width, height, bpp, px = png
    nonwhite = coloured = total = 0
    for yy in range(max(0, int(y)), min(height, int(y + h))):
        for xx in range(max(0, int(x)), min(width, int(x + w)), 2):
            i = (yy * width + xx) * bpp
            r, g, b = px[i], px[i + 1], px[i + 2]
            total += 1
            nonwhite += (r, g, b) != (255, 255, 255)
            coloured += max(r, g, b) - min(r, g, b) > 60
    return nonwhite / max(total, 1), coloured


def test_every_plot_loads_and_is_not_blank_in_headless_chromium(tmp_path):
    rows = scaling_rows()
    for i, r in enumerate(rows):
        r["peak_mem_bytes"] = (i + 1) * 2**20
    rows.append(row(1, 256, throughput=1500.0, peak_mem_bytes=9 * 2**20))
    report = write_reports(write_sweep(tmp_path / "sweep", rows))["html"]
    probed = tmp_path / "probed.html"
    probed.write_text(report.read_text().replace("</body>", PROBE + "</body>"))
    browser = tmp_path / "browser"
    browser.mkdir()

    dom = _chromium(browser, f"--window-size={WIDTH},3000", "--dump-dom", probed.as_uri()).stdout
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    probe = json.loads(html.unescape(dom[start : dom.index("</pre>", start)]))
    plots = {p["id"]: p for p in probe["plots"]}
    assert {"throughput-0", "efficiency", "breakdown", "memory", "pareto"} <= set(plots)
    for p in plots.values():
        assert p["w"] > 100 and p["h"] > 100, p
        assert p["drawn"] > 0, f"{p['id']}: no drawn marks laid out"

    shot = tmp_path / "report.png"
    height = max(3000, int(probe["height"]) + 50)
    _chromium(browser, f"--window-size={WIDTH},{height}", f"--screenshot={shot}", report.as_uri())
    png = _decode_png(shot.read_bytes())
    assert png[0] == WIDTH
    for p in plots.values():
        share, _ = _region_stats(png, p["x"], p["y"], p["w"], p["h"])
        assert share > 0.02, f"{p['id']} looks blank: {share:.1%} of its pixels are not white"
        _, coloured = _region_stats(png, *p["marks"])  # where the data marks were laid out
        assert coloured > 20, f"{p['id']}: its data marks were not painted ({coloured} pixels)"
