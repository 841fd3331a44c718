#!/usr/bin/env python3
"""Check the TensorBoard event files fsdp-train writes into a run directory.

Usage (from the repository root, e.g. by a gtest):
  .venv/bin/python tests/python/check_tensorboard.py OUT
      [--expect-tags a,b] [--expect-steps 1,5,10] [--ignore-tags hp_metric]
      [--hparams k=v,...] [--serve [--load-fast auto,false] [--serve-timeout 60]]
      [--truncate-check]

Default checks (always run):
  * every events.out.tfevents.* file in OUT is a clean sequence of TFRecords
    (length, masked CRC-32C of the length, data, masked CRC-32C of the data)
    whose first record is an Event with file_version "brain.Event:2" (without
    it EventAccumulator ignores SessionLog.START and purges by step order);
  * TensorBoard's EventAccumulator (nothing sampled away) finds at least one
    scalar tag, and every scalar event (tag, step, value) matches the last step
    line of OUT/metrics.jsonl for that step: value == numpy.float32(json value)
    ("nan"/"inf"/"-inf" strings allowed, nan equals nan); no tag has a step twice.
  --expect-tags   these scalar tags must have events.
  --expect-steps  tag "loss" must have exactly these steps.
  --ignore-tags   scalar tags left out of these checks (e.g. Lightning's hp_metric,
                  logged at step 0 again on every resume).
  --hparams       the hparams plugin data (experiment, session_start_info,
                  session_end_info, as Lightning's log_hyperparams writes them) hold
                  these values (number, string, or true/false; Lightning stores
                  bools as numbers 1.0/0.0, which is accepted too).
  --serve         starts `python -m tensorboard.main` on 127.0.0.1 (port 0) for a
                  logdir holding OUT as run basename(OUT), and checks that the
                  scalars route returns exactly the EventAccumulator's "loss" points;
                  once per --load-fast mode (default auto,false: both loaders);
                  with --hparams also the hparams dashboard's session group values.
  --truncate-check cuts a copy of the newest event file inside its last record
                  (and appends garbage) and checks EventAccumulator still reads
                  every scalar before that record, without raising.

Exit 0 when all checks hold; otherwise 1 with one line per failure on stderr.
"""

import argparse
import glob
import json
import logging
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.plugins.hparams import api_pb2, metadata as hp_metadata, plugin_data_pb2

# TensorBoard logs purges and read errors as warnings; keep stderr for failures.
logging.getLogger("tensorboard").setLevel(logging.ERROR)

EVENT_GLOB = "*tfevents*"
FILE_VERSION = "brain.Event:2"
MAX_REPORTED = 40  # failure lines printed before "... and N more"
SETTLE_S = 20.0  # serve: seconds a differing answer may take to become equal


class Failures:
    def __init__(self):
        self.lines = []

    def add(self, msg):
        self.lines.append(msg)

    def __bool__(self):
        return bool(self.lines)

    def report(self):
        for line in self.lines[:MAX_REPORTED]:
            print("check_tensorboard: FAIL: " + line, file=sys.stderr)
        if len(self.lines) > MAX_REPORTED:
            print("check_tensorboard: FAIL: ... and %d more failures"
                  % (len(self.lines) - MAX_REPORTED), file=sys.stderr)


def fmt(x):
    """Shortest text that reads back as the same float32 ('nan', 'inf' included)."""
    return str(np.float32(x))


def same_f32(a, b):
    a, b = np.float32(a), np.float32(b)
    return bool(a == b) or (bool(np.isnan(a)) and bool(np.isnan(b)))


def json_f32(v):
    """numpy.float32 of a metrics.jsonl value, or None when it is not numeric."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return np.float32(v)
    if isinstance(v, str) and v.strip().lower() in (
            "nan", "inf", "-inf", "+inf", "infinity", "-infinity", "+infinity"):
        return np.float32(float(v))
    return None


def server_f32(v):
    """numpy.float32 of a value in a TensorBoard JSON response (NaN/inf are strings)."""
    if isinstance(v, str):
        return np.float32(float(v))  # "NaN", "Infinity", "-Infinity"
    return np.float32(v)


# ----------------------------------------------------------------- inputs ---

def event_files(out):
    return sorted(f for f in glob.glob(os.path.join(out, EVENT_GLOB)) if os.path.isfile(f))


def read_records(data):
    """Split TFRecord bytes into [(offset, payload)], checking both CRCs.

    Returns (records, error); error describes the first bad record, or None."""
    records, pos = [], 0
    while pos < len(data):
        if len(data) - pos < 12:
            return records, "truncated record header at byte %d" % pos
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(header) != hcrc:
            return records, "length CRC mismatch at byte %d (stored 0x%08x, computed 0x%08x)" % (
                pos, hcrc, masked_crc32c(header))
        end = pos + 12 + length + 4
        if end > len(data):
            return records, "record at byte %d claims %d bytes, file ends at %d" % (
                pos, length, len(data))
        payload = data[pos + 12:pos + 12 + length]
        (dcrc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc32c(payload) != dcrc:
            return records, "data CRC mismatch in record at byte %d (stored 0x%08x, computed 0x%08x)" % (
                pos, dcrc, masked_crc32c(payload))
        records.append((pos, payload))
        pos = end
    return records, None


def check_framing(out, fails):
    files = event_files(out)
    if not files:
        fails.add("no %s files in %s" % (EVENT_GLOB, out))
    for path in files:
        with open(path, "rb") as f:
            records, err = read_records(f.read())
        name = os.path.basename(path)
        if err:
            fails.add("%s: %s" % (name, err))
        if not records:
            fails.add("%s: no complete record" % name)
            continue
        for i, (off, payload) in enumerate(records):
            ev = event_pb2.Event()
            try:
                ev.ParseFromString(payload)
            except Exception as e:  # noqa: BLE001 - report any protobuf decode error
                fails.add("%s: record %d at byte %d is not an Event: %s" % (name, i, off, e))
                continue
            if i == 0 and ev.file_version != FILE_VERSION:
                fails.add("%s: first record has file_version %r, expected %r"
                          % (name, ev.file_version, FILE_VERSION))
    return files


def load_metrics(out, fails):
    """{step: last step line} from OUT/metrics.jsonl."""
    path = os.path.join(out, "metrics.jsonl")
    steps = {}
    try:
        with open(path) as f:
            lines = f.readlines()
    except OSError as e:
        fails.add("cannot read %s: %s" % (path, e))
        return steps
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            fails.add("metrics.jsonl line %d is not JSON (%s): %r" % (n, e, line[:80]))
            continue
        if isinstance(obj, dict) and isinstance(obj.get("step"), int) \
                and not isinstance(obj.get("step"), bool):
            steps[obj["step"]] = obj  # a later line for the same step wins
    return steps


def accumulate(path):
    # Size guidance 0 = keep everything. Only "scalars" matters for simple_value
    # summaries; "tensors" is set too so nothing written tensor-style is sampled.
    acc = event_accumulator.EventAccumulator(
        path, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    return acc


def all_scalars(acc):
    """{tag: [ScalarEvent]} for tags with at least one event (a purge can empty a tag)."""
    found = {tag: acc.Scalars(tag) for tag in acc.Tags()[event_accumulator.SCALARS]}
    return {tag: evs for tag, evs in found.items() if evs}


# ------------------------------------------------------------- checks -------

def check_scalars(acc, metrics, args, fails):
    scalars = all_scalars(acc)
    ignore = set(args.ignore_tags)
    if not scalars:
        fails.add("no scalar tags in the event files")
    compared = 0
    for tag in sorted(scalars):
        if tag in ignore:
            continue
        events = scalars[tag]
        seen = {}
        for ev in events:
            seen[ev.step] = seen.get(ev.step, 0) + 1
        for step, n in sorted(seen.items()):
            if n > 1:
                fails.add("tag %r: step %d logged %d times" % (tag, step, n))
        for ev in events:
            line = metrics.get(ev.step)
            if line is None:
                fails.add("tag %r step %d: value %s but metrics.jsonl has no step %d line"
                          % (tag, ev.step, fmt(ev.value), ev.step))
                continue
            if tag not in line:
                fails.add("tag %r step %d: value %s but metrics.jsonl step %d has no %r"
                          % (tag, ev.step, fmt(ev.value), ev.step, tag))
                continue
            want = json_f32(line[tag])
            if want is None:
                fails.add("tag %r step %d: value %s but metrics.jsonl has non-numeric %r"
                          % (tag, ev.step, fmt(ev.value), line[tag]))
                continue
            if not same_f32(ev.value, want):
                fails.add("tag %r step %d: tensorboard %s != metrics.jsonl %s (json %r)"
                          % (tag, ev.step, fmt(ev.value), fmt(want), line[tag]))
                continue
            compared += 1
    for tag in args.expect_tags:
        if tag not in scalars:
            fails.add("expected scalar tag %r missing (have %s)" % (tag, ",".join(sorted(scalars))))
    if args.expect_steps is not None:
        got = [ev.step for ev in scalars.get("loss", [])]
        if got != args.expect_steps:
            fails.add("tag 'loss': steps %s, expected %s" % (got, args.expect_steps))
    print("tensorboard: %d tags, %d scalars equal to metrics.jsonl" % (len(scalars), compared))
    return scalars


def parse_hparam_value(text):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return float(text)
    except ValueError:
        return text


def check_hparams(acc, expected, scalars, fails):
    try:
        content = acc.PluginTagToContent(hp_metadata.PLUGIN_NAME)
    except KeyError:
        content = {}
    tags = (hp_metadata.EXPERIMENT_TAG, hp_metadata.SESSION_START_INFO_TAG,
            hp_metadata.SESSION_END_INFO_TAG)
    data = {}
    for tag in tags:
        if tag not in content:
            fails.add("hparams: no summary with tag %r (have %s)" % (tag, sorted(content)))
            continue
        pd = plugin_data_pb2.HParamsPluginData()
        try:
            pd.ParseFromString(content[tag])
        except Exception as e:  # noqa: BLE001
            fails.add("hparams: %r content is not HParamsPluginData: %s" % (tag, e))
            continue
        if pd.version != hp_metadata.PLUGIN_DATA_VERSION:
            fails.add("hparams: %r version %d, expected %d"
                      % (tag, pd.version, hp_metadata.PLUGIN_DATA_VERSION))
        data[tag] = pd

    exp = data.get(hp_metadata.EXPERIMENT_TAG)
    infos = {}
    if exp is not None:
        if exp.WhichOneof("data") != "experiment":
            fails.add("hparams: %r does not hold an experiment" % hp_metadata.EXPERIMENT_TAG)
        infos = {h.name: h for h in exp.experiment.hparam_infos}
        for m in exp.experiment.metric_infos:
            if m.name.tag not in scalars:
                fails.add("hparams: experiment metric %r is not a scalar tag" % m.name.tag)
    end = data.get(hp_metadata.SESSION_END_INFO_TAG)
    if end is not None and end.session_end_info.status != api_pb2.STATUS_SUCCESS:
        fails.add("hparams: session_end_info status %s, expected STATUS_SUCCESS"
                  % api_pb2.Status.Name(end.session_end_info.status))
    start = data.get(hp_metadata.SESSION_START_INFO_TAG)
    if start is None:
        return
    hp = start.session_start_info.hparams
    equal = 0
    for key, want in expected.items():
        if key not in hp:
            fails.add("hparams: %r missing from session_start_info (have %s)" % (key, sorted(hp)))
            continue
        val = hp[key]
        kind = val.WhichOneof("kind")
        got = getattr(val, kind) if kind else None
        if isinstance(want, bool):
            ok = (kind == "bool_value" and got == want) or \
                 (kind == "number_value" and got == float(want))
            types = (api_pb2.DATA_TYPE_BOOL, api_pb2.DATA_TYPE_FLOAT64)
        elif isinstance(want, float):
            ok = kind == "number_value" and (got == want or same_f32(got, want))
            types = (api_pb2.DATA_TYPE_FLOAT64,)
        else:
            ok = kind == "string_value" and got == want
            types = (api_pb2.DATA_TYPE_STRING,)
        if not ok:
            fails.add("hparams: %r is %s=%r, expected %r" % (key, kind, got, want))
        else:
            equal += 1
        if exp is not None:
            if key not in infos:
                fails.add("hparams: %r has no hparam_info in the experiment" % key)
            elif infos[key].type not in types:
                fails.add("hparams: %r hparam_info type %s, expected %s" % (
                    key, api_pb2.DataType.Name(infos[key].type),
                    "/".join(api_pb2.DataType.Name(t) for t in types)))
    print("tensorboard hparams: %d of %d values equal" % (equal, len(expected)))


# ---------------------------------------------------------------- serve -----

def http_json(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode("utf-8"))


def _die_with_parent():
    """In the server child: get SIGTERM if this checker dies (Linux; else no-op)."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass


def stop(proc):
    """Stop the server we started and its data-server child (its own process group)."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def check_serve(out, acc, load_fast, timeout, expected_hp, fails):
    run = os.path.basename(os.path.abspath(out))
    want = all_scalars(acc).get("loss")
    if not want:
        fails.add("serve: no 'loss' scalar events to compare")
        return
    # A private logdir with OUT linked in as run `run`, so TensorBoard does not
    # walk OUT's siblings; falls back to OUT's parent where links are unavailable.
    tmp = tempfile.mkdtemp(prefix="check_tb_")
    try:
        logdir = tmp
        try:
            os.symlink(os.path.abspath(out), os.path.join(tmp, run))
        except OSError:
            logdir = os.path.dirname(os.path.abspath(out))
        cmd = [sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
               "--host", "127.0.0.1", "--port", "0", "--load_fast", load_fast,
               "--samples_per_plugin", "scalars=%d" % max(1000, 2 * len(want))]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=_die_with_parent)
        try:
            _serve_compare(proc, run, want, load_fast, time.monotonic() + timeout,
                           expected_hp, fails)
        finally:
            stop(proc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _serve_compare(proc, run, want, load_fast, deadline, expected_hp, fails):
    output, port = [], []
    found = threading.Event()

    def pump():  # TensorBoard prints "TensorBoard 2.x at http://127.0.0.1:PORT/ ..."
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            output.append(line)
            m = re.search(r"TensorBoard \S+ at http://[^/]*:(\d+)/", line)
            if m and not port:
                port.append(int(m.group(1)))
                found.set()
        found.set()

    threading.Thread(target=pump, daemon=True).start()
    found.wait(max(0.0, deadline - time.monotonic()))
    tag = "serve(load_fast=%s)" % load_fast
    if not port:
        tail = " | ".join(output[-5:])
        fails.add("%s: tensorboard printed no URL (exit %s): %s" % (tag, proc.poll(), tail))
        return
    base = "http://127.0.0.1:%d" % port[0]
    route = "/data/plugin/scalars/scalars?" + urllib.parse.urlencode({"run": run, "tag": "loss"})
    last = "no response"
    settle = None  # once the run answers, give the loader SETTLE_S more to finish
    while time.monotonic() < min(deadline, settle or deadline):
        if proc.poll() is not None:
            last = "tensorboard exited with %s: %s" % (proc.returncode, " | ".join(output[-5:]))
            break
        try:
            runs = http_json(base + "/data/runs")
            if run not in runs:
                last = "/data/runs is %s, no %r" % (runs, run)
            else:
                rows = http_json(base + route)
                settle = settle or time.monotonic() + SETTLE_S
                last = _compare_rows(rows, want)
                if last is None:
                    print("tensorboard server: %s: %d points equal (load_fast=%s)"
                          % (route, len(want), load_fast))
                    if expected_hp:
                        _serve_hparams(base, run, expected_hp, load_fast, fails)
                    return
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = "%s: %s" % (route, e)  # not up yet, or run still loading (400/404)
        time.sleep(0.25)
    fails.add("%s: %s" % (tag, last))


def _serve_hparams(base, run, expected, load_fast, fails):
    """The hparams dashboard's session group for `run` shows the expected values."""
    route = "/data/plugin/hparams/session_groups"
    tag = "serve(load_fast=%s)" % load_fast
    body = json.dumps({"experimentName": "", "startIndex": 0, "sliceSize": 1000, "colParams": [],
                       "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS",
                                           "STATUS_FAILURE", "STATUS_RUNNING"]}).encode()
    req = urllib.request.Request(base + route, data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            groups = json.loads(r.read().decode("utf-8")).get("sessionGroups", [])
    except (urllib.error.URLError, OSError, ValueError) as e:
        fails.add("%s: %s: %s" % (tag, route, e))
        return
    got = next((g.get("hparams", {}) for g in groups if g.get("name") == run), None)
    if got is None:
        fails.add("%s: %s: no session group %r (have %s)"
                  % (tag, route, run, [g.get("name") for g in groups]))
        return
    bad = 0
    for key, want in expected.items():
        val = got.get(key)
        if isinstance(want, bool):
            ok = val == want or (not isinstance(val, str) and val == float(want))
        elif isinstance(want, float):
            ok = isinstance(val, (int, float)) and not isinstance(val, bool) \
                and (val == want or same_f32(val, want))
        else:
            ok = val == want
        if not ok:
            bad += 1
            fails.add("%s: %s: hparam %r is %r, expected %r" % (tag, route, key, val, want))
    if not bad:
        print("tensorboard server: %s: %d hparams equal (load_fast=%s)"
              % (route, len(expected), load_fast))


def _compare_rows(rows, want):
    if len(rows) != len(want):
        return "server has %d loss points (steps %s), event files %d (steps %s)" % (
            len(rows), [r[1] for r in rows], len(want), [e.step for e in want])
    for row, ev in zip(rows, want):
        wall, step, value = row
        if step != ev.step or float(wall) != ev.wall_time or not same_f32(server_f32(value), ev.value):
            return "loss step %d: server [%r, %d, %s] != event [%r, %d, %s]" % (
                ev.step, wall, step, fmt(server_f32(value)), ev.wall_time, ev.step, fmt(ev.value))
    return None


# ------------------------------------------------------------- truncate -----

def scalar_triples(acc):
    return {tag: [(e.wall_time, e.step, np.float32(e.value).tobytes()) for e in evs]
            for tag, evs in all_scalars(acc).items()}


def check_truncate(out, files, fails):
    if not files:
        fails.add("truncate-check: no event files")
        return
    newest = files[-1]  # TensorBoard reads files in name order; the last is the live one
    name = os.path.basename(newest)
    with open(newest, "rb") as f:
        data = f.read()
    records, err = read_records(data)
    if err or len(records) < 2:
        fails.add("truncate-check: %s: need >= 2 clean records (%d, %s)" % (name, len(records), err))
        return
    last_off, last_payload = records[-1]
    last_len = 12 + len(last_payload) + 4
    last_ev = event_pb2.Event.FromString(last_payload)
    last_tags = [v.tag for v in last_ev.summary.value]
    mid = last_off + last_len // 2
    variants = [  # (label, bytes of the newest file, reference: "before" or "full")
        ("cut in length field", data[:last_off + 5], "before"),
        ("cut in the middle", data[:mid], "before"),
        ("cut before data CRC end", data[:last_off + last_len - 1], "before"),
        ("cut in the middle + 64 NULs", data[:mid] + b"\0" * 64, "before"),
        ("cut in the middle + garbage", data[:mid] + bytes(range(7, 7 + 64)), "before"),
        ("complete + 64 NULs", data + b"\0" * 64, "full"),
    ]
    tmp = tempfile.mkdtemp(prefix="check_tb_trunc_")
    try:
        for f in files[:-1]:
            shutil.copy2(f, tmp)
        target = os.path.join(tmp, name)

        def load(content):
            with open(target, "wb") as f:
                f.write(content)
            return scalar_triples(accumulate(tmp))

        ref = {"before": load(data[:last_off]), "full": load(data)}
        n_before = sum(map(len, ref["before"].values()))
        n_full = sum(map(len, ref["full"].values()))
        ok = 0
        for label, content, which in variants:
            try:
                got = load(content)
            except Exception as e:  # noqa: BLE001 - any exception is a failure here
                fails.add("truncate-check: %s: EventAccumulator raised %s: %s"
                          % (label, type(e).__name__, e))
                continue
            if got != ref[which]:
                fails.add("truncate-check: %s: read %d scalars, expected %d (%s)" % (
                    label, sum(map(len, got.values())), sum(map(len, ref[which].values())),
                    "all before the last record" if which == "before" else "all"))
                continue
            ok += 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("tensorboard truncate-check: %s: last record (%d bytes at %d, step %d, tags %s) "
          "cut %d ways keep %d of %d scalars, + NULs after it keeps all; "
          "%d/%d variants read as expected" % (
              name, last_len, last_off, last_ev.step, last_tags or "-", len(variants) - 1,
              n_before, n_full, ok, len(variants)))


# ----------------------------------------------------------------- main -----

def csv_list(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out", help="run directory with metrics.jsonl and events.out.tfevents.*")
    p.add_argument("--expect-tags", type=csv_list, default=[])
    p.add_argument("--expect-steps", type=lambda s: [int(x) for x in csv_list(s)])
    p.add_argument("--ignore-tags", type=csv_list, default=[])
    p.add_argument("--hparams", type=csv_list, help="k=v,k2=v2")
    p.add_argument("--serve", action="store_true")
    # auto = the Rust data server (what `tensorboard --logdir` uses); false = the
    # Python loader, which ignores a run's first SessionLog.START: check both.
    p.add_argument("--load-fast", type=csv_list, default=["auto", "false"],
                   help="tensorboard --load_fast modes to serve with (default auto,false)")
    p.add_argument("--serve-timeout", type=float, default=60.0)
    p.add_argument("--truncate-check", action="store_true")
    args = p.parse_args(argv)
    # Turn SIGTERM (e.g. a test timeout) into SystemExit so `finally` stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    fails = Failures()
    expected_hp = {}
    for item in args.hparams or []:
        key, sep, val = item.partition("=")
        if not sep or not key:
            p.error("--hparams wants k=v, got %r" % item)
        expected_hp[key.strip()] = parse_hparam_value(val)

    files = check_framing(args.out, fails)
    metrics = load_metrics(args.out, fails)
    try:
        acc = accumulate(args.out)
    except Exception as e:  # noqa: BLE001
        fails.add("EventAccumulator(%s) raised %s: %s" % (args.out, type(e).__name__, e))
        fails.report()
        return 1
    scalars = check_scalars(acc, metrics, args, fails)
    if args.hparams is not None:
        check_hparams(acc, expected_hp, scalars, fails)
    if args.serve:
        for mode in args.load_fast:
            check_serve(args.out, acc, mode, args.serve_timeout, expected_hp, fails)
    if args.truncate_check:
        check_truncate(args.out, files, fails)

    fails.report()
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
