"""Are a speed change's results unchanged? Run a set of stacks in two source trees and compare their outputs
byte for byte.

    python benchmarks/sim_identity.py --base /path/to/frozen/tree [--work .] [--quick] [--keep DIR]
    python benchmarks/sim_identity.py --native-vs-pure [--work .] [--quick]

The second form compares one tree's compiled hot path (mypyc, tierserve/_native.py) with the same sources run
as Python (TIERSERVE_PURE_PYTHON=1); each child checks that it runs the mode it was asked for.

Each tree runs every stack in a fresh `python` with that tree first on `sys.path`, writing per stack the run's
`requests.csv` (the streamed stack writes it as requests end), `summary.json`, `summary_by_tier.csv` and
`extra.json` (every simulator statistic but wall time, and each tier's TBT histogram bins, count and sum
written with `repr` so no float is rounded). The two trees' files must be identical.

Stacks: every registered local policy behind `round_robin` (3 tiers, 2 replicas at 14 req/s, so queues build);
`llumlet` behind `llumnix`, `llumnix_k` and `llumnix_k_adaptive`, also on a small KV (preemptions, live
migrations committed and aborted); `sarathi` behind `jsq`, `infaas` and `random` on 4 replicas; `vllm` on a small
KV with swap preemption (swaps and recompute fallbacks) and with recompute; `vllm_v0` in Vidur's parity mode;
`skip_ahead` off; a time limit (censored requests); one streamed run (records written as requests end).
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()


def _workload(n: int, rate: float, fit_lengths: bool = False, preset: str | None = None) -> dict:
    # fit_lengths: the embedded fit to the same dataset (no ../shared needed, e.g. in CI's tests);
    # preset: the tiers' SLO preset ("niyama": QoS classes with deadlines, which deadline_slack orders by)
    kind = "fit" if fit_lengths else "empirical"
    tiers = {"num_tiers": 3, "mix": "uniform", **({"preset": preset} if preset else {})}
    return {"num_requests": n, "arrivals": {"kind": "poisson", "rate": rate},
            "lengths": {"kind": kind, "dataset": "azure2023_conv", "max_total_tokens": 4096}, "tiers": tiers}


def stacks(quick: bool, fit_lengths: bool = False) -> dict[str, dict]:
    """name -> scenario dict. Loads are above the 2-replica capacity (~8-10 req/s) so queues and preemption occur."""
    from tierserve.policies.local import LOCAL_POLICIES
    n = 300 if quick else 1500
    out = {}
    for local in LOCAL_POLICIES.names:
        out[f"{local}+round_robin"] = {"seed": 7, "cluster": {"num_replicas": 2, "local_policy": local,
                                                              "cluster_policy": "round_robin"},
                                       "workload": _workload(n, 14.0, fit_lengths)}
    for cluster in ("llumnix", "llumnix_k", "llumnix_k_adaptive"):
        out[f"llumlet+{cluster}"] = {"seed": 3, "cluster": {"num_replicas": 4, "local_policy": "llumlet",
                                                            "cluster_policy": cluster,
                                                            "cluster_policy_params": {"num_tiers": 3}},
                                     "workload": _workload(2 * n, 30.0, fit_lengths)}
        # A small KV: preemptions and live migrations (committed and aborted) happen.
        out[f"llumlet+{cluster}_small_kv"] = {"seed": 3, "cluster": {
            "num_replicas": 4, "local_policy": "llumlet", "cluster_policy": cluster,
            "cluster_policy_params": {"num_tiers": 3}, "replica": {"num_blocks": 900}},
            "workload": _workload(2 * n, 30.0, fit_lengths)}
    for cluster in ("jsq", "infaas", "random"):
        out[f"sarathi+{cluster}"] = {"seed": 5, "cluster": {"num_replicas": 4, "local_policy": "sarathi",
                                                            "cluster_policy": cluster},
                                     "workload": _workload(2 * n, 22.0, fit_lengths)}
    for local, blocks in (("niyama", None), ("vllm", 900)):      # deadline-slack dispatch reads every replica
        replica = {"num_blocks": blocks} if blocks else {}
        out[f"{local}+deadline_slack" + ("_small_kv" if blocks else "")] = {"seed": 17, "cluster": {
            "num_replicas": 4, "local_policy": local, "cluster_policy": "deadline_slack", "replica": replica},
            "workload": _workload(2 * n, 30.0, fit_lengths, preset="niyama")}
    out["vllm_swap_small_kv"] = {"seed": 11, "cluster": {
        "num_replicas": 2, "local_policy": "vllm", "local_policy_params": {"preempt_mode": "swap"},
        "replica": {"num_blocks": 900, "swap_space_gib": 0.05}}, "workload": _workload(n, 12.0, fit_lengths)}
    out["vllm_recompute_small_kv"] = {"seed": 12, "cluster": {
        "num_replicas": 2, "local_policy": "vllm", "replica": {"num_blocks": 700}}, "workload": _workload(n, 12.0, fit_lengths)}
    out["vllm_v0_vidur_parity"] = {"seed": 13, "cluster": {
        "num_replicas": 1, "local_policy": "vllm_v0", "replica": {"exec_mode": "vidur_parity", "token_budget": 4096,
                                                                 "max_num_seqs": 128}},
        "workload": _workload(n, 5.0, fit_lengths)}
    out["sarathi_no_skip"] = {"seed": 14, "cluster": {"num_replicas": 2, "local_policy": "sarathi",
                                                      "skip_ahead": False}, "workload": _workload(n // 2, 14.0, fit_lengths)}
    out["vllm_time_limit"] = {"seed": 15, "cluster": {"num_replicas": 2, "local_policy": "vllm",
                                                      "time_limit_s": 60.0}, "workload": _workload(n, 14.0, fit_lengths)}
    out["vllm_streamed"] = {"seed": 16, "cluster": {"num_replicas": 3, "local_policy": "vllm"},
                            "workload": _workload(n, 18.0, fit_lengths), "_stream": True}
    return out


def child(outroot: str, quick: bool, only: list[str] | None, fit_lengths: bool = False) -> None:
    """Run every stack in this interpreter (the tree under test is first on sys.path)."""
    from tierserve.experiments.scenario import ScenarioConfig, run_scenario, write_result
    for name, spec in stacks(quick, fit_lengths).items():
        if only and name not in only:
            continue
        spec = dict(spec)
        stream = spec.pop("_stream", False)
        cfg = ScenarioConfig.from_dict({"name": name, **spec})
        outdir = Path(outroot) / name
        outdir.mkdir(parents=True)
        res = run_scenario(cfg, stream=stream, outdir=outdir if stream else None, records="csv")
        write_result(res, outdir)
        hists = [{"counts": sorted(h.counts.items()), "total": h.total, "sum": repr(h.sum)}
                 for h in res.sim.tbt_by_tier]
        stats = {k: repr(v) for k, v in sorted(res.sim.stats.items()) if k != "wall_s"}
        (outdir / "extra.json").write_text(json.dumps({"stats": stats, "tbt": hists,
                                                       "duration_s": repr(res.sim.duration_s)}, indent=0))
        print(name, flush=True)


def run_tree(tree: Path, outroot: Path, quick: bool, only: list[str] | None, native: bool | None = None,
             fit_lengths: bool = False) -> None:
    """Run the stacks in `tree`; `native` True/False: require the compiled / the pure-Python hot path."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")
    env.pop("TIERSERVE_PURE_PYTHON", None)
    if native is False:
        env["TIERSERVE_PURE_PYTHON"] = "1"
    cmd = [sys.executable, str(HERE), "--child", str(outroot), "--tree", str(tree)] + (["--quick"] if quick else []) \
        + (["--only", ",".join(only)] if only else []) + ([] if native is None else ["--require-native", str(native)]) \
        + (["--fit-lengths"] if fit_lengths else [])
    proc = subprocess.run(cmd, cwd=str(tree), env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tree {tree} failed:\n{proc.stderr[-3000:]}")


KEPT_WITH = "sim_identity.json"     # in each tree's folder: what its outputs were made with (tree, options)


def _stacks_in(folder: Path) -> set[str]:
    """The stack folders under a tree's outputs (not its manifest, its options file or our hidden files)."""
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")}


def kept_with(folder: Path) -> dict | None:
    """What a kept folder's outputs were made with, if they were published whole (manifest complete)."""
    from tierserve.core.outputs import read_manifest
    manifest = read_manifest(folder) if folder.is_dir() else None
    if not (manifest and manifest.get("complete") and KEPT_WITH in manifest["files"]):
        return None
    return json.loads((folder / KEPT_WITH).read_text())


def compare(a: Path, b: Path) -> list[str]:
    diffs = []
    names = sorted(_stacks_in(a) | _stacks_in(b))
    for name in names:
        fa, fb = a / name, b / name
        if not fa.is_dir() or not fb.is_dir():
            diffs.append(f"{name}: only in {'base' if fa.is_dir() else 'work'}")
            continue
        files = sorted({p.name for p in fa.iterdir()} | {p.name for p in fb.iterdir()})
        for f in files:
            if not (fa / f).exists() or not (fb / f).exists() or not filecmp.cmp(fa / f, fb / f, shallow=False):
                diffs.append(f"{name}/{f} differs")
    return diffs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="the frozen tree (e.g. a `git worktree` of the commit before the change)")
    ap.add_argument("--work", default=str(HERE.parent.parent), help="the tree under test (default: this one)")
    ap.add_argument("--quick", action="store_true", help="300 requests per stack instead of 1,500")
    ap.add_argument("--only", default=None, help="comma-separated stack names")
    ap.add_argument("--keep", default=None, help="write the outputs here instead of a temporary folder; "
                    "the base tree's outputs found there are reused when they were made from the same tree "
                    "with the same options (recorded in base/sim_identity.json)")
    ap.add_argument("--native-vs-pure", action="store_true",
                    help="compare --work's compiled hot path with its pure-Python sources (no --base)")
    ap.add_argument("--fit-lengths", action="store_true",
                    help="lengths from the embedded azure2023_conv fit instead of the dataset in ../shared")
    ap.add_argument("--list", action="store_true", help="print the stack names and stop")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--require-native", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    only = args.only.split(",") if args.only else None
    if args.list:
        print("\n".join(stacks(True, True)))
        return 0
    if args.child:
        import tierserve
        imported = Path(tierserve.__file__).resolve().parent.parent
        if imported != Path(args.tree).resolve():       # an editable install must not shadow the tree under test
            raise SystemExit(f"imported tierserve from {imported}, not {args.tree}")
        from tierserve import _native
        if args.require_native is not None and str(_native.NATIVE_IN_USE) != args.require_native:
            raise SystemExit(f"asked for native={args.require_native}, running {_native.REASON}")
        child(args.child, args.quick, only, args.fit_lengths)
        return 0
    if args.native_vs_pure:
        if args.base:
            ap.error("--native-vs-pure compares --work with itself: no --base")
        work = base = Path(args.work).resolve()
        runs = (("base", base, False), ("work", work, True))      # base = pure Python, work = compiled
    elif not args.base:
        ap.error("--base is required (a frozen copy of the tree before the change), or --native-vs-pure")
    else:
        base, work = Path(args.base).resolve(), Path(args.work).resolve()
        runs = (("base", base, None), ("work", work, None))
    from tierserve.core.outputs import output_folder
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for label, tree, native in runs:
            made_with = {"tree": str(tree), "quick": args.quick, "only": only, "native": native,
                         "fit_lengths": args.fit_lengths}
            if label == "base" and args.keep and kept_with(root / label) == made_with:
                continue                   # the frozen tree's outputs from an earlier call (--keep), same options
            # each tree's outputs published whole with manifest.json (a rerun replaces only what a previous run
            # listed; nothing else under --keep is removed)
            with output_folder(root / label, "--keep") as stage:
                run_tree(tree, stage, args.quick, only, native, args.fit_lengths)
                (stage / KEPT_WITH).write_text(json.dumps(made_with, indent=1) + "\n")
        diffs = compare(root / "base", root / "work")
        n = len(_stacks_in(root / "base"))
    if diffs:
        print(f"DIFFERENT ({len(diffs)} of {n} stacks' files):")
        for d in diffs:
            print("  " + d)
        return 1
    what = f"pure Python vs compiled, {work}" if args.native_vs_pure else f"{base} vs {work}"
    print(f"IDENTICAL: {n} stacks, every output file byte for byte ({what})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
