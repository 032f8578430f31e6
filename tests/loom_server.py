"""A `loom serve` process for the Python serve tests (serve_client.py,
gguf_chat.py): started on a free port, ready when it prints its
"ready on" line, its stderr kept in `log`, stopped by SIGTERM."""
import re, signal, subprocess, threading, time


class LoomServer:
    def __init__(self, args, env=None, start_s=180, stop_s=60):
        """args: the whole command line, `loom serve --port 0 ...`. start_s and
        stop_s are failure guards only: the start ends at the ready line."""
        self.p = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env)
        self.log, self.port, self.stop_s = [], None, stop_s
        t0 = time.time()
        while time.time() - t0 < start_s:
            line = self.p.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"ready on http://[^:]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            raise RuntimeError("loom serve did not start: " + "".join(self.log))
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.p.stderr:
            self.log.append(line)

    def url(self, path):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def stop(self):
        """SIGTERM, then the exit status (None if it had to be killed)."""
        rc = self.p.returncode
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                rc = self.p.wait(self.stop_s)
            except subprocess.TimeoutExpired:
                self.p.kill()
                rc = None
        return rc
