"""A separate product process for the crash tests of ``cluster.create`` and of node actions:

    python -m tests.crash_create_worker DATA_DIR AWS_PORT KUBE_PORT SPEED [submit REQUEST_JSON]
    python -m tests.crash_create_worker DATA_DIR AWS_PORT KUBE_PORT SPEED [replace|delete CLUSTER REQUEST_JSON]

It runs the product's services (the real operation kinds) against a running sandbox; with ``submit`` it submits
a create, with ``replace``/``delete`` that node action on an imported cluster, and prints the operation id. The
test SIGKILLs it mid-operation and starts it again: the engine resumes what the killed process left.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from app.bootstrap import build_services
from services.auth import Principal, Role
from services.clusters.create_models import ClusterCreate
from services.nodes.models import NodeDelete, NodeDestroy
from services.settings import Settings
from tests.support import until_terminated


def main() -> None:
    data, aws_port, kube_port, speed = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    services = build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=aws_port,
                                       sandbox_kube_port=kube_port, sandbox_speed=speed, workers=2),
                              exclusive=True)
    services.start()  # resumes what a killed process left
    args = sys.argv[5:]
    if args and args[0] == "submit":
        request = ClusterCreate.model_validate(json.loads(args[1]))
        op, _ = services.clusters.create_cluster(Principal("crash", Role.OPERATOR, "t-crash", "api"), request)
        print(op.id, flush=True)
    elif args and args[0] in ("replace", "delete"):
        admin = Principal("crash", Role.ADMIN, "t-crash", "api")
        if args[0] == "replace":
            op, _ = services.nodes.replace_nodes(admin, args[1], NodeDestroy.model_validate(json.loads(args[2])))
        else:
            op, _ = services.nodes.delete_nodes(admin, args[1], NodeDelete.model_validate(json.loads(args[2])))
        print(op.id, flush=True)
    until_terminated(services.stop)


if __name__ == "__main__":
    main()
