"""tandem ui in a real browser: Debian's chromium (headless) driven by Selenium through Debian's
chromedriver, against a real `tandem serve` (the cloud) and `tandem ui` (the edge), both on
127.0.0.1 with free ports. Nothing is downloaded: the browser and the driver are the system's.

  test_ui_browser.py TANDEM EDGE.gguf CLOUD.gguf OUT_DIR [--docs]

Loads the page; sends a prompt in route mode with the keyboard and sees tokens of both sources;
moves the target cloud-share slider from high to 0 and sees the share fall; asks for too many
tokens and sees the 400 named; reloads and sees the conversation again; kills the cloud and sees
the fallback notice. Screenshots go to OUT_DIR. --docs: also light/dark and wide/narrow shots
for docs/ (run by scripts/ui_screenshots.sh with the real default pair).
Exits 77 (skipped) when chromium, chromedriver or selenium is missing.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
if not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)):
    print(f"skipped: {CHROMIUM} or {CHROMEDRIVER} is missing (scripts/setup.sh installs them)")
    sys.exit(77)
try:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait
except ImportError:
    print("skipped: no selenium in this Python (scripts/setup.sh installs it in the venv)")
    sys.exit(77)

TANDEM, EDGE, CLOUD, OUT = sys.argv[1:5]
DOCS = "--docs" in sys.argv[5:]
# The whole test must end well inside CTest's limit even if something hangs.
BUDGET_S = 240 if DOCS else 55
PROMPT = ("Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of Spain?\nA: Madrid\n"
          "Q: What is the capital of France?\nA:") if DOCS else "The capital of France is"
N_PREDICT = "40" if DOCS else "24"
LONG = "200"  # tokens of the answers that are reloaded or stopped midway
T0 = time.time()
checks = 0


def check(condition, what):
    global checks
    checks += 1
    print(f"[{time.time() - T0:5.1f}s] {'ok  ' if condition else 'FAIL'} {what}", flush=True)
    if not condition:
        raise AssertionError(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout_s):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


class SlowLink:
    """A loopback TCP proxy that holds every chunk from the cloud for `delay_s`: a network round
    trip, so that an answer from the tiny test models lasts long enough to reload the page or
    press Escape in the middle of it."""

    def __init__(self, upstream_port, delay_s):
        self.upstream, self.delay_s = upstream_port, delay_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.listener.accept()
            try:
                server = socket.create_connection(("127.0.0.1", self.upstream), timeout=5)
            except OSError:
                client.close()  # the cloud is down: the device sees a dropped connection
                continue
            server.settimeout(None)
            threading.Thread(target=self._pump, args=(client, server, 0), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.delay_s), daemon=True).start()

    @staticmethod
    def _pump(src, dst, delay_s):
        try:
            while data := src.recv(65536):
                if delay_s:
                    time.sleep(delay_s)
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def start(args, log_name):
    log = open(os.path.join(OUT, log_name), "wb")
    return subprocess.Popen([TANDEM, *args], stdout=log, stderr=subprocess.STDOUT)


def main():
    os.makedirs(OUT, exist_ok=True)
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(TimeoutError(f"over {BUDGET_S} s")))
    signal.alarm(BUDGET_S)
    cloud_port, ui_port = free_port(), free_port()
    cloud = start(["serve", "-m", CLOUD, "--port", str(cloud_port), "-t", "1"], "serve.log")
    ui = None
    driver = None
    try:
        wait_http(f"http://127.0.0.1:{cloud_port}/health", 60)
        # The docs run shows real latencies; the test's tiny models need the slow link.
        link_port = cloud_port if DOCS else SlowLink(cloud_port, 0.025).port
        ui = start(["ui", "-m", EDGE, "--cloud", f"http://127.0.0.1:{link_port}",
                    "--port", str(ui_port), "-t", "1", "--cloud-timeout", "2", "-n", N_PREDICT],
                   "ui.log")
        page = f"http://127.0.0.1:{ui_port}/"
        wait_http(page + "api/info", 60)
        with urllib.request.urlopen(page + "api/info", timeout=5) as r:
            defaults = json.load(r)["defaults"]
        check(defaults.get("target_rate") == 0.07 and defaults.get("temp") == 0,
              f"without --threshold, --target-rate or --temp the page opens at a 7% target share, "
              f"greedy ({defaults})")
        with urllib.request.urlopen(page, timeout=5) as r:
            csp = r.headers.get("Content-Security-Policy") or ""
        check("default-src 'self'" in csp and "frame-ancestors 'none'" in csp,
              f"the page is served with a Content-Security-Policy ({csp})")

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1280,900", "--force-device-scale-factor=1"):
            options.add_argument(arg)
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP reports land there
        os.environ["SE_OFFLINE"] = "true"  # never let Selenium Manager look for a driver online
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        driver.set_page_load_timeout(20)
        wait = WebDriverWait(driver, 30 if DOCS else 15, poll_frequency=0.05)
        run(driver, wait, page, cloud)
    finally:
        if driver:
            driver.quit()
        for p in (ui, cloud):
            if p and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
        signal.alarm(0)


def shot(driver, name):
    path = os.path.join(OUT, name + ".png")
    driver.save_screenshot(path)
    print(f"           screenshot {path}")


def by_id(driver, id_):
    return driver.find_element(By.ID, id_)


def set_slider(driver, fraction):
    """Moves the slider with the keyboard: Home, then arrow steps of 0.01."""
    slider = by_id(driver, "level")
    slider.send_keys(Keys.HOME)
    slider.send_keys(Keys.ARROW_RIGHT * round(fraction * 100))
    return float(slider.get_attribute("value"))


def send(driver, wait, turns_before, keys=Keys.ENTER):
    """Presses Enter (or `keys`) in the prompt and waits for the turn to finish."""
    by_id(driver, "prompt").send_keys(keys)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) > turns_before
               and d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle")
    last = driver.find_elements(By.CSS_SELECTOR, "#turns .turn")[-1]
    return last


def type_prompt(driver):
    prompt = by_id(driver, "prompt")
    prompt.clear()
    prompt.send_keys(PROMPT.replace("\n", Keys.SHIFT + Keys.ENTER + Keys.SHIFT))


def share_of(turn):
    local = len(turn.find_elements(By.CSS_SELECTOR, ".tok.local"))
    cloud = len(turn.find_elements(By.CSS_SELECTOR, ".tok.cloud"))
    return local, cloud


def run(driver, wait, page, cloud):
    driver.get(page)
    wait.until(lambda d: "edge" in by_id(d, "pair").text)
    check(driver.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle",
          "the page loads and is idle")

    # Route mode, confidence policy, target share high: both sources appear.
    driver.find_element(By.CSS_SELECTOR, "#mode option[value=route]").click()
    driver.find_element(By.CSS_SELECTOR, "#policy option[value=confidence]").click()
    driver.find_element(By.CSS_SELECTOR, "#route-by input[value=target]").click()
    high = set_slider(driver, 0.6)
    check(abs(high - 0.6) < 1e-6 and by_id(driver, "level-value").text == "60 %",
          f"the slider moves with the keyboard to {high}")
    type_prompt(driver)
    turn = send(driver, wait, 0)
    local, cloud_tokens = share_of(turn)
    check(local > 0 and cloud_tokens > 0, f"tokens of both sources: {local} local, {cloud_tokens} cloud")
    share_high = float(by_id(driver, "stat-cloud-share").text.rstrip(" %"))
    check(share_high > 0, f"cloud share shown at target 60 %: {share_high} %")
    check(int(by_id(driver, "stat-route-events").text) > 0, "route events counted")
    check(by_id(driver, "stat-bytes-up").text not in ("–", "…"), "bytes up shown")
    check(len(by_id(driver, "chart").find_elements(By.CSS_SELECTOR, "circle.cloud")) == cloud_tokens,
          "the chart marks every cloud token")
    # Every routed token's score is above the threshold it was decided against, every local
    # one's at or below it (a fallback was routed, though decoded locally).
    decisions = driver.execute_script(
        "return [...state.current.tokens].map(t => [t.source === 'cloud' || t.fallback, t.score, t.threshold]);")
    consistent = all(routed == (score > th) for routed, score, th in decisions if th is not None)
    check(consistent, f"sources agree with score vs threshold for {len(decisions)} tokens")
    # Hover (focus) a cloud token: the tip shows its score and the small model's choice.
    first_cloud = turn.find_element(By.CSS_SELECTOR, ".tok.cloud")
    driver.execute_script("arguments[0].focus()", first_cloud)
    tip = by_id(driver, "tip")
    check(tip.is_displayed() and "router score" in tip.text and "the small model would have said" in tip.text,
          f"focusing a cloud token shows its score and the small model's token: {tip.text!r}")
    shot(driver, "route-target-60")
    if DOCS:
        docs_shots(driver)
    driver.execute_script("document.activeElement.blur()")

    # Target share 0: the share falls.
    low = set_slider(driver, 0.0)
    check(low == 0.0 and by_id(driver, "level-value").text == "0 %", "slider at 0 %")
    turn = send(driver, wait, 1, Keys.CONTROL + Keys.ENTER)
    share_low = float(by_id(driver, "stat-cloud-share").text.rstrip(" %"))
    check(share_low < share_high, f"cloud share falls with the slider: {share_high} % -> {share_low} %")
    shot(driver, "route-target-0")

    # Out-of-range input reaches the server and comes back as a 400 naming the field.
    n = by_id(driver, "n-predict")
    n.clear()
    n.send_keys("5000")
    by_id(driver, "prompt").send_keys(Keys.CONTROL + Keys.ENTER)
    wait.until(lambda d: by_id(d, "form-error").text)
    check(by_id(driver, "form-error").text.startswith("n_predict: "),
          f"a bad field is named: {by_id(driver, 'form-error').text!r}")
    n.clear()
    n.send_keys(N_PREDICT)

    # A reload (the browser reconnecting) shows the conversation again.
    driver.refresh()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) == 2)
    check(len(driver.find_elements(By.CSS_SELECTOR, "#turns .tok.cloud")) >= cloud_tokens,
          "after a reload the kept turns are drawn again")
    check(by_id(driver, "level-value").text == "0 %" and by_id(driver, "prompt").get_attribute("value") == PROMPT
          and by_id(driver, "n-predict").get_attribute("value") == N_PREDICT,
          "and the tab's settings and prompt are kept")

    # A reload in the middle of an answer: the page finds the running turn, attaches to it again
    # and ends with every token once. (At a 60 % share the answer waits on the slow link.)
    set_slider(driver, 0.6)
    n = by_id(driver, "n-predict")
    n.clear()
    n.send_keys(LONG)
    turns = len(driver.find_elements(By.CSS_SELECTOR, "#turns .turn"))
    by_id(driver, "prompt").send_keys(Keys.ENTER)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, f"#turns .turn:nth-child({turns + 1}) .tok")) >= 3)
    driver.refresh()
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#turns .turn")) == turns + 1)
    check(driver.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "running",
          "after a reload mid-answer the page is following the running turn")
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle")
    tokens_drawn = driver.execute_script("return state.current.tokens.length")
    done = driver.execute_script("return state.current.done")
    check(done and done["stats"]["tokens"] == tokens_drawn and
          len(driver.find_elements(By.CSS_SELECTOR, f"#turns .turn:nth-child({turns + 1}) .tok")) == tokens_drawn,
          f"the re-attached turn has each of its {tokens_drawn} tokens once")

    # Escape stops an answer in the middle (the server's token callback returns false).
    check(by_id(driver, "n-predict").get_attribute("value") == LONG, "settings kept over the reload")
    by_id(driver, "prompt").send_keys(Keys.ENTER)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, f"#turns .turn:nth-child({turns + 2}) .tok")) >= 3)
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") == "idle")
    done = driver.execute_script("return state.current.done")
    check(done["stop"] == "stopped" and done["stats"]["tokens"] < int(LONG),
          f"Escape stopped the answer at {done['stats']['tokens']} of {LONG} tokens")
    n = by_id(driver, "n-predict")
    n.clear()
    n.send_keys(N_PREDICT)

    # The cloud goes away: the answer still comes, locally, and the page says so.
    cloud.kill()
    cloud.wait(timeout=10)
    driver.find_element(By.CSS_SELECTOR, "#route-by input[value=target]").click()
    set_slider(driver, 0.6)
    turns = len(driver.find_elements(By.CSS_SELECTOR, "#turns .turn"))
    turn = send(driver, wait, turns)
    local, cloud_tokens = share_of(turn)
    fallbacks = int(by_id(driver, "stat-fallbacks").text)
    notice = by_id(driver, "notice")
    check(local > 0 and cloud_tokens == 0, f"with the cloud gone every token is local ({local})")
    check(fallbacks > 0, f"fallbacks counted: {fallbacks}")
    rings = len(by_id(driver, "chart").find_elements(By.CSS_SELECTOR, "circle.fallback"))
    check(rings == fallbacks, f"the chart rings every fallback ({rings})")
    check(notice.is_displayed() and "Cloud unavailable" in notice.text,
          f"the notice says so: {notice.text!r}")
    driver.execute_script("window.scrollTo(0, 0)")  # the notice and the stats are at the top
    shot(driver, "cloud-down")
    # The page works under its own Content-Security-Policy: nothing was refused.
    refused = [e["message"] for e in driver.get_log("browser")
               if "Content Security Policy" in e["message"] or "Refused to" in e["message"]]
    check(not refused, f"no Content-Security-Policy violations in the console {refused[:3]}")
    print(f"{checks} checks passed in {time.time() - T0:.1f} s")


def docs_shots(driver):
    """Light and dark, wide and narrow, for docs/ui.md: the first answer, a cloud token's tip
    shown in the wide ones."""
    # A cloud token where the two models disagree shows best what routing buys.
    index = driver.execute_script(
        "const ts = state.current.tokens.filter(t => t.source === 'cloud');"
        "const t = ts.find(t => t.edge_top1 && t.edge_top1.id !== t.id) || ts[0]; return t.i;")
    cloud_token = driver.find_element(By.CSS_SELECTOR, f"#turns .turn:last-child .tok[data-i='{index}']")
    for scheme in ("light", "dark"):
        driver.execute_cdp_cmd("Emulation.setEmulatedMedia",
                               {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
        for name, size in (("wide", (1280, 900)), ("narrow", (390, 1600))):
            driver.set_window_size(*size)
            driver.execute_script("document.activeElement.blur();"
                                  "window.dispatchEvent(new Event('resize')); window.scrollTo(0, 0);")
            if name == "wide":
                driver.execute_script("arguments[0].focus()", cloud_token)
            time.sleep(0.3)
            shot(driver, f"docs-{scheme}-{name}")
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    driver.set_window_size(1280, 900)


if __name__ == "__main__":
    main()
