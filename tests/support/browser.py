"""A real headless Chromium for the report's tests and benchmark: Debian's ``chromium`` through its
``chromium-driver`` (``scripts/apt-packages.txt``), driven by Selenium, with every request of the page
logged (:func:`requests_made`) and http(s) and websockets blocked besides."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
BLOCKED = ["http://*", "https://*", "ws://*", "wss://*", "ftp://*"]


def start_chromium(profile_dir: Path) -> WebDriver:
    """Headless Chromium with its own profile folder; raises if it or its driver is not installed."""
    if not CHROMEDRIVER.exists() or not CHROMIUM.exists():
        raise RuntimeError(
            "Chromium or its driver is missing: apt-get install chromium chromium-driver (scripts/setup.sh)"
        )
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in (
        "--headless=new",
        "--no-sandbox",  # root, in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--user-data-dir={profile_dir}",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": BLOCKED})
    except BaseException:
        driver.quit()
        raise
    return driver


def requests_made(driver: WebDriver) -> list[str]:
    """Every URL the page asked for since the last call (the performance log drains as it is read)."""
    urls = []
    for entry in driver.get_log("performance"):
        message: dict[str, Any] = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls
