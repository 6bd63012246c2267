"""A cluster-detail read from the product's caches vs the incumbent's pattern, on a large sandbox cluster.

A: ``GET /api/v1/clusters/{cluster}`` on a running ``instantstart serve`` (sandbox mode) after import and
informer sync: nodes and pods come from the watch-backed informers, EKS/HyperPod descriptions from the AWS
cache (viewer token, one keep-alive connection).
B: what the incumbent does per read: ``kubectl get nodes -o json`` plus ``aws sagemaker list-cluster-nodes``
as subprocesses, against the same sandbox (``instantstart kubeconfig`` / ``instantstart sandbox env``).

    python bench/cluster_read.py [--nodes 1000] [-n 20] [--incumbent-runs 5]

Needs ``kubectl`` and the ``aws`` CLI on PATH (or ``--aws /path/to/aws``; ``pip install awscli`` into a venv
of its own will do).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.world import World, seeded_world, timed_get  # noqa: E402


def incumbent_read(world: World, aws: str, kubectl: str) -> tuple[float, int, int]:
    """One read the incumbent's way: seconds, and how many nodes each tool returned."""
    env = {**os.environ, **world.aws_env}
    started = time.perf_counter()
    nodes = subprocess.run([kubectl, "--kubeconfig", str(world.kubeconfig), "get", "nodes", "-o", "json"],
                           capture_output=True, text=True, timeout=300, env=env)
    listed = subprocess.run([aws, "sagemaker", "list-cluster-nodes", "--cluster-name", world.cluster,
                             "--endpoint-url", world.aws_env["AWS_ENDPOINT_URL"], "--output", "json"],
                            capture_output=True, text=True, timeout=300, env=env)
    elapsed = time.perf_counter() - started
    for name, out in (("kubectl", nodes), ("aws", listed)):
        if out.returncode != 0:
            raise RuntimeError(f"{name} failed ({out.returncode}): {out.stderr[-1000:]}")
    return (elapsed, len(json.loads(nodes.stdout)["items"]),
            len(json.loads(listed.stdout)["ClusterNodeSummaries"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000, help="HyperPod nodes of the seeded cluster")
    parser.add_argument("-n", type=int, default=20, help="reads of A")
    parser.add_argument("--incumbent-runs", type=int, default=5, help="reads of B")
    parser.add_argument("--aws", default=shutil.which("aws"), help="the aws CLI (default: from PATH)")
    parser.add_argument("--kubectl", default=shutil.which("kubectl"), help="kubectl (default: from PATH)")
    args = parser.parse_args(argv)
    missing = [name for name, path in (("aws", args.aws), ("kubectl", args.kubectl)) if not path]
    if missing:
        print(f"{' and '.join(missing)} not found: the incumbent's side needs both (pip install awscli into a "
              "venv of its own; kubectl from https://kubernetes.io/docs/tasks/tools/)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp, seeded_world(Path(tmp), args.nodes) as world:
        viewer = world.live.make_token("viewer", "bench-viewer")
        url = f"{world.live.url}/api/v1/clusters/{world.cluster}"
        with httpx2.Client(headers={"Authorization": f"Bearer {viewer}"}, timeout=120) as client:
            timed_get(client, url)  # admits the token
            ours = [timed_get(client, url) for _ in range(args.n)]
        theirs: list[float] = []
        for _ in range(args.incumbent_runs):
            elapsed, from_kubectl, from_aws = incumbent_read(world, args.aws, args.kubectl)
            if (from_kubectl, from_aws) != (args.nodes, args.nodes):
                raise RuntimeError(f"the incumbent saw {from_kubectl} Kubernetes and {from_aws} HyperPod nodes, "
                                   f"not {args.nodes}")
            theirs.append(elapsed)
        body = len(httpx2.get(url, headers={"Authorization": f"Bearer {viewer}"}, timeout=120).content)
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"cluster of {args.nodes} nodes (seeded in {world.seed_seconds:.1f} s); detail body {body:,} bytes")
    print(f"A GET /api/v1/clusters/{{cluster}} from the caches: median {a * 1000:.1f} ms "
          f"(min {min(ours) * 1000:.1f}, max {max(ours) * 1000:.1f}, n={len(ours)})")
    print(f"B kubectl get nodes -o json + aws sagemaker list-cluster-nodes: median {b * 1000:.0f} ms "
          f"(min {min(theirs) * 1000:.0f}, max {max(theirs) * 1000:.0f}, n={len(theirs)})")
    print(f"ratio B/A: {b / a:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
