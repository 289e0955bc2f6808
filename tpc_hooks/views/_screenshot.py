"""A PNG of a rendered page, taken with a headless Chromium where one is installed (the demo's
screenshot of a monitored generation)."""

import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

log = logging.getLogger("tpc_hooks._demo")

CHROMIUMS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium() -> str | None:
    """The path of a Chromium (or Chrome) on PATH, or None."""
    return next((p for p in map(shutil.which, CHROMIUMS) if p), None)


def screenshot(page: Path, png: Path, *, size: tuple[int, int] = (1100, 640), timeout: float = 120) -> bool:
    """A PNG of the HTML file ``page`` taken with headless Chromium; False, with a log line,
    where no Chromium is installed or it fails (never raises for that)."""
    exe = chromium()
    if exe is None:
        log.warning(
            "no Chromium on PATH (%s): no screenshot of %s (apt-get install chromium)", ", ".join(CHROMIUMS), page.name
        )
        return False
    png = Path(png)
    # --no-sandbox: root and containers have no usable sandbox; the page is our static HTML,
    # whose policy forbids scripts and outside resources. A fresh profile: never share one.
    try:
        png.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="tpc-chromium-") as profile:
            cmd = [
                exe,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--no-first-run",
                "--mute-audio",
                f"--user-data-dir={profile}",
                f"--window-size={size[0]},{size[1]}",
                f"--screenshot={png.resolve()}",
                Path(page).resolve().as_uri(),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        log.warning("Chromium (%s) could not take a screenshot of %s: %s", exe, page.name, err)
        return False
    if not png.is_file() or png.stat().st_size == 0:
        log.warning(
            "Chromium (%s) exited %s without a screenshot of %s: %s",
            exe,
            proc.returncode,
            page.name,
            proc.stderr.strip()[-400:],
        )
        return False
    return True
