"""A headless Chromium driven over the DevTools protocol, with the standard library only: Chromium
started with --remote-debugging-pipe reads commands from its fd 3 and writes answers and events to
its fd 4, each a JSON message ended by a NUL byte (no websocket needed). One page, one session."""
import json
import os
import select
import shutil
import subprocess
import time


def find():
    """The Chromium binary (Debian's package: chromium), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class Error(Exception):
    pass


class Browser:
    def __init__(self, binary, work_dir, timeout=20.0):
        """Chromium with its profile under work_dir, its output in work_dir/chromium.log."""
        self.timeout = timeout
        self.events = []  # every event received, in order: {"method", "params", "sessionId"?}
        self._id = 0
        self._buf = b""
        self.session = None
        cmd_r, self._cmd_w = os.pipe()  # we write, Chromium reads (its fd 3)
        self._res_r, res_w = os.pipe()  # Chromium writes (its fd 4), we read

        def fds():  # in the child: the two pipe ends as fds 3 and 4, inheritable
            a, b = os.dup(cmd_r), os.dup(res_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        args = [binary, "--headless", "--remote-debugging-pipe", "--user-data-dir=" + os.path.join(work_dir, "profile"),
                "--no-first-run", "--no-default-browser-check", "--disable-gpu",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                "--disable-component-update", "--disable-default-apps", "--disable-dev-shm-usage",
                "--mute-audio", "--window-size=1000,800", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.log_path = os.path.join(work_dir, "chromium.log")
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, close_fds=False, preexec_fn=fds)
        os.close(cmd_r)
        os.close(res_w)

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except Exception:
            pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._cmd_w)
        os.close(self._res_r)
        self.log.close()

    def _read_message(self, deadline):
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Error("no message from Chromium within %.0f s" % self.timeout)
            r, _, _ = select.select([self._res_r], [], [], left)
            if not r:
                continue
            chunk = os.read(self._res_r, 1 << 16)
            if not chunk:
                raise Error("Chromium closed its pipe (exit status %r)" % self.proc.poll())
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method, params=None, session=True):
        """Sends a command (to the page's session unless session is False) and returns its
        result; events received meanwhile go to self.events."""
        self._id += 1
        m = {"id": self._id, "method": method, "params": params or {}}
        if session and self.session:
            m["sessionId"] = self.session
        data = json.dumps(m).encode() + b"\0"
        while data:
            data = data[os.write(self._cmd_w, data):]
        deadline = time.monotonic() + self.timeout
        while True:
            msg = self._read_message(deadline)
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise Error("%s: %s" % (method, msg["error"].get("message")))
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def open_page(self):
        """A new tab, attached; Page, Runtime and Network events on."""
        t = self.call("Target.createTarget", {"url": "about:blank"}, session=False)
        a = self.call("Target.attachToTarget", {"targetId": t["targetId"], "flatten": True},
                      session=False)
        self.session = a["sessionId"]
        for d in ("Page", "Runtime", "Network"):
            self.call(d + ".enable")

    def navigate(self, url):
        """Loads url and waits for its load event."""
        n = len(self.events)
        r = self.call("Page.navigate", {"url": url})
        if r.get("errorText"):
            raise Error("navigate %s: %s" % (url, r["errorText"]))
        self.wait(lambda: any(e["method"] == "Page.loadEventFired" for e in self.events[n:]),
                  "the load event of " + url)

    def eval(self, expr, await_promise=False):
        """The value of a JavaScript expression in the page (JSON-serializable)."""
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": await_promise})
        if "exceptionDetails" in r:
            d = r["exceptionDetails"]
            raise Error("%s: %s" % (expr, d.get("exception", {}).get("description", d.get("text"))))
        return r["result"].get("value")

    def wait(self, cond, what, timeout=None):
        """Polls cond() (which may call eval) until true; fails naming what it waited for."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            v = cond()
            if v:
                return v
            if time.monotonic() > deadline:
                raise Error("timed out waiting for " + what)
            self._pump(0.02)

    def _pump(self, seconds):
        """Takes the events that come within seconds into self.events."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if b"\0" not in self._buf:
                if left <= 0 or not select.select([self._res_r], [], [], left)[0]:
                    return
            msg = self._read_message(time.monotonic() + self.timeout)
            if "method" in msg:
                self.events.append(msg)

    def click(self, selector):
        """A real mouse click (press and release) in the middle of the element."""
        box = self.eval("(() => { const e = document.querySelector(%s); if (!e) return null;"
                        " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
                        " return [r.x + r.width / 2, r.y + r.height / 2]; })()" % json.dumps(selector))
        if not box:
            raise Error("no element " + selector)
        for t in ("mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", {"type": t, "x": box[0], "y": box[1],
                                                   "button": "left", "clickCount": 1})

    def type(self, text):
        """Text typed into the focused element, as a keyboard or an input method would."""
        self.call("Input.insertText", {"text": text})

    def key(self, name, code, keycode):
        """One key pressed and released (e.g. "Enter", "Enter", 13)."""
        base = {"key": name, "code": code, "windowsVirtualKeyCode": keycode,
                "nativeVirtualKeyCode": keycode}
        self.call("Input.dispatchKeyEvent", dict(base, type="rawKeyDown"))
        self.call("Input.dispatchKeyEvent", dict(base, type="keyUp"))
