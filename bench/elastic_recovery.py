"""How long an elastic torchrun job of fsdp-train takes to continue after a
node is lost (3 -> 2 hosts) and after a node joins (2 -> 3), split into
detection, rendezvous and checkpoint load, beside the load of a plain
`fsdp-run ... --resume-from` of the same checkpoint at the new world size.

  .venv/bin/python bench/elastic_recovery.py [--presets default,100m]
      [--scenarios lost,grow] [--repeat 1] [--workdir DIR] [--keep-dirs]

Needs root and the ip tool (the hosts are network namespaces, as in
tests/support/test_hosts.h: host i at 10.77.0.<i+1>/24, a veth pair each to
a bridge in a namespace of its own; here named fsdpb-*, removed at exit, on
Ctrl-C too), and build/bin/fsdp-train and fsdp-run. Each host runs one
torchrun agent (docs/launching.md, "Elastic jobs") with one worker:

  ip netns exec HOST .venv/bin/torchrun --nnodes 2:3 --nproc-per-node 1
    --rdzv-backend c10d --rdzv-endpoint 10.77.0.1:PORT --rdzv-id JOB
    --local-addr 10.77.0.<i+1>
    --rdzv-conf is_host=1|0,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3
    --max-restarts 3 --no-python build/bin/fsdp-train --preset P --steps N
    --batch B --save-every K --keep 100 --log-every 1 --eval-every 0 --out DIR

with OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 FSDP_TIMEOUT_S=60 LOGLEVEL=INFO
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (torchrun logs its agent's INFO lines
only with LOGLEVEL=INFO; growing needs the last, docs/launching.md; without
--local-addr the workers get MASTER_ADDR=localhost in the namespaces). PORT
is 29400, one more for each run. Every line of every agent and worker is
timestamped (time.monotonic()) as it arrives.

  lost: 3 hosts; once a checkpoint written at world 3 has committed and
        training is min(2, K-1) steps past it, host 2's agent and worker are
        SIGKILLed (T0). detection: T0 -> a survivor's agent logs "Worker
        group FAILED. ... will restart worker group"; rendezvous: -> the last
        survivor logs "Starting worker group" (right after "Rendezvous
        complete for workers") for the workers that resume (a first new
        group that fails, restarted by the agents, counts as rendezvous and
        is reported as a problem); load: -> "fsdp-train: resumed from";
        first step: -> the first "step S/N" line after it.
  grow: 2 hosts; after the first checkpoint host 2's agent is started (T0).
        detection: T0 -> an agent logs "Detected 1 new nodes ...; will
        restart worker group" (includes the new agent's start-up); then as
        above, the last of the 3 agents' "Starting worker group".
  plain: fsdp-run --nproc-per-node <new world> -- fsdp-train ...
        --resume-from <the checkpoint the elastic job resumed from>: process
        start -> "resumed from", compared with worker start -> "resumed
        from" of the elastic restart (both: process start, process group,
        model build and the checkpoint's read).

Prints one JSON line per run and a markdown table at the end; the agents'
logs stay in the work directory (checkpoints are removed unless --keep-dirs).
"""
import argparse
import ctypes
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = ROOT / ".venv/bin/torchrun"
TRAIN = ROOT / "build/bin/fsdp-train"
FSDP_RUN = ROOT / "build/bin/fsdp-run"
# Per preset: per-rank batch, steps, checkpoint interval, deadline of one run (s).
PRESETS = {
    "tiny": dict(batch=2, steps=300, save_every=20, deadline=300),
    "default": dict(batch=4, steps=100, save_every=10, deadline=600),
    "100m": dict(batch=1, steps=8, save_every=2, deadline=900),
}
RDZV_CONF = "last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3"
# Launcher variables the environment could leak into the programs.
UNSET = ("RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT GROUP_RANK GROUP_WORLD_SIZE "
         "ROLE_RANK ROLE_WORLD_SIZE TORCHELASTIC_RUN_ID TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS "
         "TORCHELASTIC_USE_AGENT_STORE SLURM_NTASKS SLURM_PROCID SLURM_LOCALID SLURM_NODELIST SLURM_JOB_NODELIST "
         "SLURM_STEP_NODELIST SLURM_JOB_ID SLURM_NNODES OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK PMI_SIZE PMI_RANK "
         "FSDP_CLUSTER").split()

FAILED = r"\[default\] Worker group (FAILED|UNHEALTHY)\..* will restart worker group"
JOINED = r"\[default\] Detected \d+ new nodes from group_rank=\d+; will restart worker group"
STARTING = r"\[default\] Starting worker group"
WORLD = r"group_world_size=(\d+)"
RESUMED = r"fsdp-train: resumed from (\S+) at step (\d+)"
STEP = r"\bstep (\d+)/\d+ loss"


def env():
    e = {k: v for k, v in os.environ.items() if k not in UNSET}
    e.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", FSDP_TIMEOUT_S="60", LOGLEVEL="INFO",
             TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return e


class Hosts:
    """n network namespaces joined by a bridge, as tests/support/test_hosts.h."""

    def __init__(self, n):
        tag = str(os.getpid())
        self.switch = f"fsdpb-sw-{tag}"
        self.names = [f"fsdpb-h{i}-{tag}" for i in range(n)]
        self.links = [f"fbh{tag}-{i}" for i in range(n)]
        self.cmds = [f"ip netns add {self.switch}", f"ip -n {self.switch} link add br0 type bridge",
                     f"ip -n {self.switch} link set br0 up"]
        for i, (ns, h) in enumerate(zip(self.names, self.links)):
            s = f"fbs{tag}-{i}"
            self.cmds += [f"ip netns add {ns}", f"ip link add {h} type veth peer name {s}", f"ip link set {h} netns {ns}",
                          f"ip link set {s} netns {self.switch}", f"ip -n {self.switch} link set {s} master br0",
                          f"ip -n {self.switch} link set {s} up", f"ip -n {ns} addr add {address(i)}/24 dev {h}",
                          f"ip -n {ns} link set {h} up", f"ip -n {ns} link set lo up"]

    def up(self):
        for c in self.cmds:
            r = subprocess.run(c.split(), capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"cannot make the test hosts (needs root and the ip tool): `{c}`: {r.stderr.strip()}")

    def down(self):  # deleting a namespace deletes its ends of the veth pairs
        for ns in self.names + [self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        for link in self.links:  # if never moved into its namespace
            subprocess.run(["ip", "link", "del", link], capture_output=True)

    def pids(self, i):
        r = subprocess.run(["ip", "netns", "pids", self.names[i]], capture_output=True, text=True)
        return {int(p) for p in r.stdout.split()}


def address(i):
    return f"10.77.0.{i + 1}"


class Log:
    """Every line of the processes followed, as (monotonic time, who, text)."""

    def __init__(self, path):
        self.events, self.lock, self.t0 = [], threading.Lock(), time.monotonic()
        self.file = open(path, "w", buffering=1)

    def follow(self, proc, who):
        def read(stream):
            for raw in iter(stream.readline, b""):
                t, text = time.monotonic(), raw.decode(errors="replace").rstrip("\r\n")
                with self.lock:
                    self.events.append((t, who, text))
                    self.file.write(f"{t - self.t0:9.3f} {who} {text}\n")
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=read, args=(stream,), daemon=True).start()
        return proc

    def mark(self, text):
        t = time.monotonic()
        with self.lock:
            self.file.write(f"{t - self.t0:9.3f} -- {text}\n")
        return t

    def all(self, pattern, after, before=None, who=None):
        """Every (time, who, match) of `pattern` after `after` (and before `before`), in time order."""
        if after is None:
            return []
        rx = re.compile(pattern)
        with self.lock:
            hits = [(t, w, m) for t, w, x in self.events if t > after and (before is None or t < before)
                    and (who is None or w in who) and (m := rx.search(x))]
        return sorted(hits, key=lambda e: e[0])

    def first(self, pattern, after, who=None):
        """The earliest (time, who, match) of `pattern` after `after`, or None."""
        hits = self.all(pattern, after, who=who)
        return hits[0] if hits else None


def descendants(pid):
    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                stat = Path(f"/proc/{d}/stat").read_text()
                parent[int(d)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        todo += kids
    return found


def kill(pids):
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def kill_all_started():
    """Ends every process this script started, orphans included (it is their subreaper), and reaps them."""
    for _ in range(100):
        left = descendants(os.getpid())
        if not left:
            return
        kill(left)
        try:
            while os.waitpid(-1, os.WNOHANG)[0] != 0:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.05)


def wait_until(cond, deadline, what):
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metrics(out):
    recs = []
    try:
        for line in (out / "metrics.jsonl").read_text().splitlines():
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError:
                pass  # a line being written
    except FileNotFoundError:
        pass
    return [r for r in recs if "step" in r]


def committed(out):
    return sorted(int(d.name[5:]) for d in (out / "checkpoints").glob("step-*") if (d / ".metadata").exists())


def past_a_checkpoint(out, world, steps_past):
    """Training runs at `world`, and is `steps_past` steps past a checkpoint written at that world."""
    recs = metrics(out)
    if not recs or recs[-1].get("world") != world:
        return False
    seg = len(recs)
    while seg > 0 and recs[seg - 1].get("world") == world:
        seg -= 1
    ours = [s for s in committed(out) if s >= recs[seg]["step"]]
    return bool(ours) and recs[-1]["step"] >= ours[0] + steps_past


def train_flags(preset, out):
    p = PRESETS[preset]
    return [str(TRAIN), "--preset", preset, "--steps", str(p["steps"]), "--batch", str(p["batch"]), "--save-every",
            str(p["save_every"]), "--keep", "100", "--log-every", "1", "--eval-every", "0", "--out", str(out)]


def agent(hosts, i, port, job, flags, log):
    cmd = ["ip", "netns", "exec", hosts.names[i], str(TORCHRUN), "--nnodes", "2:3", "--nproc-per-node", "1",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{address(0)}:{port}", "--rdzv-id", job,
           "--local-addr", address(i), "--rdzv-conf", f"is_host={int(i == 0)},{RDZV_CONF}",
           "--max-restarts", "3", "--no-python"] + flags
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(), start_new_session=True)
    return log.follow(p, f"h{i}")


def at(event):
    return event[0] if event else None


def gap(a, b):
    return None if a is None or b is None else round(b - a, 2)


def analyse(log, t0, lost, row):
    """The phases after T0 from the agents' and workers' lines, into `row`.

    The workers start in the last round before "resumed from": when the first
    new group fails, the agents restart it, and that time counts as rendezvous
    (and is reported as a problem)."""
    world, others = (2, ["h0", "h1"]) if lost else (3, ["h0", "h1", "h2"])
    if not lost:  # the new node's agent has imported torch and begins its rendezvous
        row["new_agent_up_s"] = gap(t0, at(log.first(r"\[default\] Rendezvous'ing worker group", t0, {"h2"})))
    detected = at(log.first(FAILED if lost else JOINED, t0, {"h0", "h1"}))
    resumed = log.first(RESUMED, detected)
    starts = [log.all(STARTING, detected, at(resumed), {w}) for w in others]
    last = [s[-1][0] for s in starts] if resumed and all(starts) else None
    started = max(last) if last else None
    stepped = at(log.first(STEP, at(resumed)))
    row.update(detection_s=gap(t0, detected), rendezvous_s=gap(detected, started), load_s=gap(started, at(resumed)),
               first_step_s=gap(at(resumed), stepped), total_s=gap(t0, stepped))
    if resumed:
        row["resumed_from"], row["resumed_step"] = resumed[2].group(1), int(resumed[2].group(2))
    rounds = max((len(s) for s in starts), default=0)
    if rounds > 1:
        row["problems"].append(f"the workers were started {rounds} times before one resumed: the first new group "
                               "failed (see the log); rendezvous_s includes the failed rounds")
    worlds = {int(x[2].group(1)) for x in log.all(WORLD, last and min(last) - 0.2, at(resumed))}
    if worlds != {world}:
        row["problems"].append(f"the new rendezvous gave group_world_size {sorted(worlds)}, expected {world}")


def elastic(kind, preset, hosts, port, work, rep):
    """One elastic run: the times of its phases and its checks."""
    name = f"{kind}-{preset}-{rep}"
    out, log = work / name, Log(work / f"{name}.log")
    job, flags = f"fsdpb-{name}-{os.getpid()}", train_flags(preset, out)
    deadline = time.monotonic() + PRESETS[preset]["deadline"]
    lost = kind == "lost"
    row = dict(scenario="lost node 3 → 2" if lost else "growth 2 → 3", preset=preset, problems=[])
    try:
        procs = [agent(hosts, i, port, job, flags, log) for i in range(3 if lost else 2)]
        if lost:
            wait_until(lambda: past_a_checkpoint(out, 3, min(2, PRESETS[preset]["save_every"] - 1)), deadline,
                       "a checkpoint at world 3")
            kill({procs[2].pid} | set(descendants(procs[2].pid)) | hosts.pids(2))  # the node is gone
            t0 = log.mark("T0: host 2 killed")
            procs.pop()
        else:
            wait_until(lambda: past_a_checkpoint(out, 2, 0), deadline, "a checkpoint at world 2")
            t0 = log.mark("T0: host 2 started")
            procs.append(agent(hosts, 2, port, job, flags, log))
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
            if p.returncode != 0:
                row["problems"].append(f"an agent exited with {p.returncode}")
    except (TimeoutError, subprocess.TimeoutExpired) as e:
        row["problems"].append(str(e))
        return row, out
    finally:
        kill_all_started()
    analyse(log, t0, lost, row)
    recs = metrics(out)
    world = 2 if lost else 3
    resizes = [r["resized"] for r in recs if r.get("resized", {}).get("to_world") == world]
    row["resize"] = resizes[-1] if resizes else None
    row["seconds_lost"] = resizes[-1].get("seconds_lost") if resizes else None
    row["end"] = dict(step=recs[-1]["step"], world=recs[-1]["world"]) if recs else None
    if row["end"] != dict(step=PRESETS[preset]["steps"], world=world):
        row["problems"].append(f"the run did not end at step {PRESETS[preset]['steps']}, world {world}: {row['end']}")
    if not resizes:
        row["problems"].append(f"metrics.jsonl records no resize to world {world}")
    return row, out


def plain_resume(ckpt, world, preset, work, name):
    """fsdp-run --resume-from at `world`: process start -> "resumed from", -> its first step."""
    out, log = work / f"{name}-plain", Log(work / f"{name}-plain.log")
    flags = train_flags(preset, out) + ["--resume-from", ckpt]
    t0 = time.monotonic()
    p = subprocess.Popen([str(FSDP_RUN), "--nproc-per-node", str(world), "--"] + flags, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=env(), start_new_session=True)
    log.follow(p, "plain")

    def stepped():
        resumed = log.first(RESUMED, t0)
        return resumed and log.first(STEP, resumed[0])
    try:
        wait_until(lambda: stepped() or p.poll() is not None, time.monotonic() + PRESETS[preset]["deadline"],
                   "the plain resume's first step")
    except TimeoutError:
        pass
    finally:
        kill_all_started()
    resumed = at(log.first(RESUMED, t0))
    return gap(t0, resumed), gap(resumed, at(log.first(STEP, resumed))), out


def fmt(v):
    return "n/a" if v is None else f"{v:.2f}" if isinstance(v, float) else str(v)


def table(rows):
    lines = ["| scenario | preset | detection s | rendezvous s | load s (elastic) | load s (plain --resume-from) | "
             "to first step s | T0 → first step s | seconds_lost (fsdp-train) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append("| " + " | ".join(fmt(r.get(k)) for k in (
            "scenario", "preset", "detection_s", "rendezvous_s", "load_s", "plain_load_s", "first_step_s", "total_s",
            "seconds_lost")) + " |")
    return "\n".join(lines)


def interrupted(*_):
    raise KeyboardInterrupt


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__[__doc__.index("\n\n") + 2:])
    ap.add_argument("--presets", default="default,100m")
    ap.add_argument("--scenarios", default="lost,grow")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--workdir", type=Path, default=Path(f"/tmp/fsdpb-elastic-{os.getpid()}"))
    ap.add_argument("--keep-dirs", action="store_true", help="keep the runs' checkpoints")
    a = ap.parse_args()
    presets, kinds = a.presets.split(","), a.scenarios.split(",")
    for x in presets:
        if x not in PRESETS:
            ap.error(f"--presets: {x} is none of {', '.join(PRESETS)}")
    for x in kinds:
        if x not in ("lost", "grow"):
            ap.error(f"--scenarios: {x} is neither lost nor grow")
    for f in (TORCHRUN, TRAIN, FSDP_RUN):
        if not os.access(f, os.X_OK):
            sys.exit(f"{f} is missing: build fsdp-cpp first (scripts/build.sh)")
    # Orphaned workers (their agent killed) become this process's children, so
    # that kill_all_started() finds them; SIGTERM ends the run as Ctrl-C does.
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    signal.signal(signal.SIGTERM, interrupted)
    a.workdir.mkdir(parents=True, exist_ok=True)
    hosts, rows, port = Hosts(3), [], 29400
    try:
        hosts.up()
        for rep in range(a.repeat):
            for preset in presets:
                for kind in kinds:
                    row, out = elastic(kind, preset, hosts, port, a.workdir, rep)
                    port += 1  # no run meets the sockets of the one before
                    if row.get("resumed_from"):
                        row["plain_load_s"], row["plain_first_step_s"], plain = plain_resume(
                            row["resumed_from"], 2 if kind == "lost" else 3, preset, a.workdir, out.name)
                        if not a.keep_dirs:
                            shutil.rmtree(plain, ignore_errors=True)
                    if not a.keep_dirs:
                        shutil.rmtree(out / "checkpoints", ignore_errors=True)
                    rows.append(row)
                    print(json.dumps(row, ensure_ascii=False), flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        kill_all_started()
        hosts.down()
    print()
    print(table(rows))
    for r in rows:
        if r.get("detection_s") is not None and r.get("rendezvous_s") is not None:
            fast = r["detection_s"] + r["rendezvous_s"] <= 30
            load = r.get("load_s") is not None and r.get("plain_load_s") is not None and r["load_s"] <= r["plain_load_s"]
            print(f"{r['scenario']}, {r['preset']}: detection + rendezvous {r['detection_s'] + r['rendezvous_s']:.1f} s "
                  f"({'≤' if fast else '>'} 30 s); load {fmt(r.get('load_s'))} s vs plain {fmt(r.get('plain_load_s'))} s"
                  f" ({'no longer' if load else 'longer'})")
        for p in r["problems"]:
            print(f"{r['scenario']}, {r['preset']}: PROBLEM: {p}")
    print(f"logs: {a.workdir}")
    return 1 if any(r["problems"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
