"""Chaos: run `loom train --resume auto` and interrupt it at random moments
(SIGKILL of the whole process group, as when a machine vanishes; SIGTERM
then SIGKILL after a random grace, as spot machines do; and SIGKILL from
inside a checkpoint write at a random protocol point through
LOOM_TEST_KILL_AT), restart the same command line each time, and at the
end compare the final weights with an uninterrupted run's: they must be
bit-identical for the same world size.

usage: chaos.py LOOM WORKDIR ROUNDS NPROC [SEED]
Prints PASS/FAIL lines and a summary line:
  chaos: nproc N, trials T, interruptions I, resumes R, time lost S s (P%)
"""
import filecmp, os, random, signal, subprocess, sys, time

# Kill points (src/ckpt/checkpoint.c, src/ckpt/run.c): inside the checkpoint
# protocol, and while a fresh start clears and makes the run folder.
POINTS = ["ckpt_files", "ckpt_manifest", "ckpt_renamed", "ckpt_latest", "ckpt_prune", "run_prepare"]
STEPS, EVERY = 40, 3


def command(loom, work, out, nproc):
    c = [loom, "train", "--resume", "auto", "--data", os.path.join(work, "text.txt"), "--out", out,
         "--layers", "1", "--channels", "32", "--heads", "2", "--context", "32", "--batch", "2", "--seq", "16",
         "--steps", str(STEPS), "--warmup", "4", "--lr", "3e-3", "--ckpt-every", str(EVERY), "--keep-ckpts", "2",
         "--eval-every", "0", "--sample-tokens", "0", "--threads", "1", "--log-every", "1000"]
    if nproc > 1:
        c += ["--nproc", str(nproc), "--zero", "1", "--dist-timeout", "300"]  # a guard: deaths are seen by the closed connection
    return c


def start(cmd, log, env=None):
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, **(env or {})))


def wait(p, timeout=900):  # a guard only: an attempt takes seconds
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return "timeout"


def final_weights(out):
    return os.path.join(out, "checkpoints", "step_%08d" % STEPS, "model.safetensors")


def reference(loom, work, nproc):
    out = os.path.join(work, "ref%d" % nproc)
    with open(out + ".log", "w") as log:
        t0 = time.time()
        rc = wait(start(command(loom, work, out, nproc), log))
        return out, rc, time.time() - t0


def interrupt(p, rng, duration):
    """One random interruption of a running attempt; returns its kind."""
    kind = rng.choice(["kill", "kill", "term"])
    time.sleep(rng.uniform(0.0, duration))
    if p.poll() is not None:
        return "finished"
    try:
        if kind == "kill":
            os.killpg(p.pid, signal.SIGKILL)
        else:
            os.kill(p.pid, signal.SIGTERM)  # the launcher passes it to its ranks
            time.sleep(rng.uniform(0.0, 0.5))
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return kind


def trial(loom, work, nproc, rounds, rng, duration, ref, stats):
    """Interrupt one run until it completes (or `rounds` interruptions)."""
    out = os.path.join(work, "chaos%d_%d" % (nproc, stats["trials"]))
    log = open(out + ".log", "w")
    t0, done, bad = time.time(), 0, []
    while done < rounds:
        env = {}
        if rng.random() < 0.3:
            env["LOOM_TEST_KILL_AT"] = "%s:%d" % (rng.choice(POINTS), rng.randint(1, 3))
        log.write("---- attempt %d %s\n" % (done, env))
        log.flush()
        p = start(command(loom, work, out, nproc), log, env)
        kind = "inject" if env else interrupt(p, rng, 0.7 * duration)
        rc = wait(p)
        done += 1
        stats["interruptions"] += kind != "finished"
        # 0: finished; 75: preempted, resumable; a kill: -9/137 (or the
        # launcher's report of a killed rank); a SIGTERM before the first
        # step ends the process at once: -15/143. Anything else fails.
        if rc not in (0, 75, -9, 137, -15, 143) and not (kind in ("kill", "inject") and rc in (1, 3)):
            bad.append("attempt %d (%s) exited %s" % (done, kind, rc))
        if rc == 0 and os.path.exists(final_weights(out)):
            break
    while True:  # let it finish
        log.write("---- final\n")
        log.flush()
        rc = wait(start(command(loom, work, out, nproc), log))
        if rc == 0 or len(bad) > 3:
            break
        bad.append("finishing attempt exited %s" % rc)
    stats["time"] += time.time() - t0
    stats["trials"] += 1
    log.close()
    stats["resumes"] += open(out + ".log").read().count("loom train: resuming")
    same = os.path.exists(final_weights(out)) and filecmp.cmp(final_weights(ref), final_weights(out), shallow=False)
    return same, bad, out


def main():
    loom, work, rounds, nproc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) > 5 else int(time.time())
    rng = random.Random(seed)
    random.seed(5)
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write(" ".join(random.choice(["in", "the", "beginning", "God", "created", "heaven", "and", "earth."]) for _ in range(20000)))
    ref, rc, ref_time = reference(loom, work, nproc)
    if rc != 0:
        print("FAIL chaos_reference_%d: exit %s: %s" % (nproc, rc, open(ref + ".log").read()[-300:]))
        return 1
    stats = {"trials": 0, "interruptions": 0, "resumes": 0, "time": 0.0}
    failed, problems = 0, []
    while stats["interruptions"] < rounds:
        same, bad, out = trial(loom, work, nproc, rounds - stats["interruptions"], rng, ref_time, ref, stats)
        if same and not bad:
            subprocess.run(["rm", "-rf", out])
        else:
            failed += 1
            problems.append("%s; weights %s; log %s" % ("; ".join(bad) or "-", "identical" if same else "DIFFER", out + ".log"))
    name = "chaos_%d_rank%s_%d_interruptions_bit_identical" % (nproc, "s" if nproc > 1 else "", rounds)
    if not failed:
        print("PASS %s (%d runs, seed %d)" % (name, stats["trials"], seed))
    else:
        print("FAIL %s (seed %d): %d of %d runs: %s" % (name, seed, failed, stats["trials"], " | ".join(problems[:3])))
    lost = stats["time"] - stats["trials"] * ref_time
    print("chaos: nproc %d, trials %d, interruptions %d, resumes %d, uninterrupted run %.2f s, time lost %.1f s (%.0f%% over %d runs)"
          % (nproc, stats["trials"], stats["interruptions"], stats["resumes"], ref_time, lost,
             100 * lost / max(1e-9, stats["trials"] * ref_time), stats["trials"]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
