"""Screenshots of each kind of html page, for docs/html.md and the README (`make screenshots`).

Each page is written by the hookcli command shown in docs/html.md and opened, offline, in
the system's Chromium through Playwright; the top of the page (up to ``HEIGHT`` pixels)
is saved as ``OUT/html-KIND.png``.

    python docs/screenshots.py docs        # what `make screenshots` runs
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 1500

# kind -> (the command line after `hookcli`, what the picture shows first)
PAGES: dict[str, list[str]] = {
    "inspect": ["inspect", "hf:llama:causal-lm", "--device", "meta"],
    "grads": ["grads", "resnet18", "-i", "1x3x64x64", "--depth", "2"],
    "stats": ["stats", "sample_models.faulty:NaNModel"],
    "cost": ["cost", "resnet18", "-i", "1x3x64x64"],
    "profile": ["profile", "resnet18", "-i", "1x3x64x64", "--backward", "--repeat", "3"],
    "ablate": ["ablate", "sample_models:LeNet", "--layer", "conv*", "--layer", "fc*"],
    "diff": ["diff", "{old}", "{new}"],
}
# a section to scroll to before the picture is taken (the chart says the most there)
FOCUS = {"grads": "#charts", "cost": "#charts", "profile": "#charts", "diff": "#charts"}


def hookcli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hookcli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "HOOKCLI_NO_CONFIG": "1"},
        check=False,
    )


def main(out: Path) -> int:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("HOOKCLI_CHROMIUM") or shutil.which("chromium")
    chromium = chromium or shutil.which("chromium-browser")
    if chromium is None:
        print("no chromium on PATH (make screenshots installs it as root)", file=sys.stderr)
        return 1
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        old, new = folder / "old.json", folder / "new.json"
        for path, seed in ((old, "0"), (new, "1")):
            hookcli("grads", "sample_models:LeNet", "--seed", seed, "-f", "json", "-o", str(path))
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for kind, args in PAGES.items():
                page_path = folder / f"{kind}.html"
                argv = [a.format(old=old, new=new) for a in args]
                result = hookcli(*argv, "-o", str(page_path))
                if result.returncode not in (0, 1):
                    print(f"{kind}: hookcli {' '.join(argv)} failed:\n{result.stderr}")
                    return 1
                page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                page.route(
                    "**/*",
                    lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort(),
                )
                page.goto(page_path.resolve().as_uri())
                page.wait_for_selector("body[data-ready='1']")
                target = out / f"html-{kind}.png"
                if kind in FOCUS:
                    page.locator(FOCUS[kind]).scroll_into_view_if_needed()
                    top = page.evaluate(f"document.querySelector('{FOCUS[kind]}').offsetTop")
                    page.evaluate(f"window.scrollTo(0, {max(0, top - 420)})")
                    page.screenshot(path=str(target))
                else:
                    page.screenshot(path=str(target))
                print(f"{target}: hookcli {' '.join(args)}")
                page.close()
            browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")))
