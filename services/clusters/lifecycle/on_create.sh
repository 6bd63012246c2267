#!/bin/bash
# on_create.sh: run by SageMaker HyperPod once on every new node of an InstantStart cluster, before the node
# joins EKS. Shipped pinned inside the InstantStart package and uploaded by the hyperpod stage of
# cluster.create; never fetched from a branch at run time.
#
# It moves containerd's and the kubelet's data onto the extra EBS volume HyperPod mounts at /opt/sagemaker
# (InstanceStorageConfigs), so container images and pod volumes do not fill the root volume.
set -euo pipefail

LOG_DIR=/var/log/provision
mkdir -p "$LOG_DIR"
exec > >(tee -a "$LOG_DIR/provisioning.log") 2>&1
echo "[instantstart] on_create.sh start on $(hostname)"

DATA=/opt/sagemaker
if mountpoint -q "$DATA"; then
  mkdir -p "$DATA/containerd" "$DATA/kubelet"
  if [ -f /etc/eks/containerd/containerd-config.toml ]; then
    sed -i "s|^root = .*|root = \"$DATA/containerd\"|" /etc/eks/containerd/containerd-config.toml
  fi
  if [ -d /var/lib/kubelet ] && [ ! -L /var/lib/kubelet ]; then
    cp -a /var/lib/kubelet/. "$DATA/kubelet/" && rm -rf /var/lib/kubelet
  fi
  ln -sfn "$DATA/kubelet" /var/lib/kubelet
  echo "[instantstart] containerd and kubelet data on $DATA"
else
  echo "[instantstart] $DATA is not mounted; keeping containerd and kubelet data on the root volume"
fi

echo "[instantstart] on_create.sh done"
