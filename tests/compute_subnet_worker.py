"""A separate product process that makes one compute subnet, for the crash test of a VPC CIDR block added
between ``AssociateVpcCidrBlock`` and the subnet's create:

    python -m tests.compute_subnet_worker DATA_DIR AWS_PORT KUBE_PORT VPC_ID ZONE CLUSTER

It opens the installation on ``DATA_DIR`` (its state database, where the intent is recorded) without
starting its engine and calls :func:`ensure_compute_subnet` as the network stage does; the test SIGKILLs it
while the sandbox holds the association's answer.
"""

from __future__ import annotations

import sys
from pathlib import Path

from app.bootstrap import build_services
from services.clusters.create_base import cluster_tags
from services.clusters.intents import ResourceIntents
from services.clusters.network import ensure_compute_subnet
from services.settings import Settings


def main() -> None:
    data, aws_port, kube_port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    vpc_id, zone, cluster = sys.argv[4:7]
    services = build_services(Settings(data_dir=data, sandbox=True, sandbox_aws_port=aws_port,
                                       sandbox_kube_port=kube_port, workers=1))
    ec2 = services.aws.for_stages().client("ec2")
    print(ensure_compute_subnet(ec2, vpc_id, zone, cluster, cluster_tags(cluster),
                                intents=ResourceIntents(services.db, services.clock)), flush=True)


if __name__ == "__main__":
    main()
