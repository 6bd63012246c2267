"""A separate product process for the cluster.create crash test:

    python -m tests.crash_create_worker DATA_DIR AWS_PORT KUBE_PORT SPEED [submit REQUEST_JSON]

It runs the product's services (the real ``cluster.create`` kind) against a running sandbox; with
``submit`` it submits a create and prints the operation id. The test SIGKILLs it during a stage and starts it
again: the engine resumes what the killed process left.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.bootstrap import build_services
from services.auth import Principal, Role
from services.clusters.create_models import ClusterCreate
from services.settings import Settings
from tests.support import until_terminated


def main() -> None:
    data, aws_port, kube_port, speed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    services = build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=aws_port,
                                       sandbox_kube_port=kube_port, sandbox_speed=speed, workers=2),
                              exclusive=True)
    services.start()  # resumes what a killed process left
    if len(sys.argv) > 6 and sys.argv[5] == "submit":
        request = ClusterCreate.model_validate(json.loads(sys.argv[6]))
        op, _ = services.clusters.create_cluster(Principal("crash", Role.OPERATOR, "t-crash", "api"), request)
        print(op.id, flush=True)
    until_terminated(services.stop)


if __name__ == "__main__":
    main()
