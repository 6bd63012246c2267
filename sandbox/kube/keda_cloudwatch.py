"""KEDA's ``aws-cloudwatch`` scaler in the sandbox: a trigger's metric read from the sandbox's CloudWatch (moto,
where a test's ``PutMetricData`` lands) with ``GetMetricData``, as KEDA's scaler asks it.

Metadata: ``namespace``, ``metricName``, ``dimensionName`` / ``dimensionValue`` (``;``-separated, paired),
``targetMetricValue`` (the threshold), ``activationTargetMetricValue`` (default 0), ``minMetricValue`` (the value
when CloudWatch has no datapoint; default 0), ``metricStat`` (default ``Average``), ``metricStatPeriod`` (default
300) and ``metricCollectionTime`` (default 300; the window, in real seconds, since CloudWatch keeps wall-clock
timestamps), ``awsRegion`` (required, no default). Refused as KEDA's parser refuses them (kedacore/keda
``pkg/scalers/aws_cloudwatch_scaler.go``, its messages): a ``metricStat`` other than CloudWatch's five statistics, a
``metricStatPeriod`` other than 1, 5, 10, 30, 60 or a multiple of 60, a ``metricCollectionTime`` that is not a
multiple of the period, no ``awsRegion``. The value is the newest period's statistic in the window. Credentials:
KEDA's own (the sandbox accepts any). Not modelled: ``identityOwner``, TriggerAuthentication,
``metricEndTimeOffset``, expressions.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from .cluster import Cluster

TYPE = "aws-cloudwatch"
_KEY_ID, _SECRET = "ASIAKEDAPODIDENTITY01", "sandbox-keda-operator"
_CLIENTS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()
STATISTICS = ("SampleCount", "Average", "Sum", "Minimum", "Maximum")  # CloudWatch's Statistic values, in its order


def check(meta: dict[str, Any]) -> str:
    """Why KEDA refuses the trigger's metadata ("" when it is fine)."""
    for key in ("namespace", "metricName", "targetMetricValue"):
        if not meta.get(key):
            return f"error parsing cloudwatch metadata: {key} not given"
    names, values = (str(meta.get(k) or "").split(";") for k in ("dimensionName", "dimensionValue"))
    if len(names) != len(values):
        return "error parsing cloudwatch metadata: dimensionName and dimensionValue have different lengths"
    try:
        for key in ("targetMetricValue", "activationTargetMetricValue", "minMetricValue"):
            float(meta.get(key) or 0)
    except ValueError as exc:
        return f"error parsing cloudwatch metadata: {exc}"
    return _stat_problem(meta)


def _stat_problem(meta: dict[str, Any]) -> str:
    """KEDA's checks of ``metricStat``, ``metricStatPeriod``, ``metricCollectionTime`` and ``awsRegion``."""
    stat = str(meta.get("metricStat") or "Average")
    if stat not in STATISTICS:
        return f"error parsing cloudwatch metadata: metricStat '{stat}' is not one of [{' '.join(STATISTICS)}]"
    try:
        period, window = (int(str(meta.get(k) or 300)) for k in ("metricStatPeriod", "metricCollectionTime"))
    except ValueError as exc:
        return f"error parsing cloudwatch metadata: {exc}"
    if period < 1:
        return f"error parsing cloudwatch metadata: metricStatPeriod can not be smaller than 1, however, {period} " \
               "is provided"
    if period < 60 and period not in (1, 5, 10, 30):
        return "error parsing cloudwatch metadata: metricStatPeriod < 60 has to be one of [1, 5, 10, 30], however, " \
               f"{period} is provided"
    if period % 60 and period > 60:
        return "error parsing cloudwatch metadata: metricStatPeriod >= 60 has to be a multiple of 60, however, " \
               f"{period} is provided"
    if window < 0 or window % period:
        return "error parsing cloudwatch metadata: metricCollectionTime must be greater than 0 and a multiple of " \
               f"metricStatPeriod({period}), {window} is given"
    return "" if meta.get("awsRegion") else "error parsing cloudwatch metadata: no awsRegion given"


def _client(endpoint: str, region: str) -> Any:
    with _LOCK:
        if (endpoint, region) not in _CLIENTS:
            import boto3

            make: Any = boto3.client  # its overloads want a literal service name
            _CLIENTS[(endpoint, region)] = make("cloudwatch", endpoint_url=endpoint, region_name=region,
                                                aws_access_key_id=_KEY_ID, aws_secret_access_key=_SECRET)
        return _CLIENTS[(endpoint, region)]


def value(cluster: Cluster, meta: dict[str, Any]) -> float | None:
    """The metric's newest value (None: the cluster has no cloud, or CloudWatch refused)."""
    if cluster.cloud is None:
        return None
    endpoint, _ = cluster.cloud
    names = [n for n in str(meta.get("dimensionName") or "").split(";") if n]
    values = str(meta.get("dimensionValue") or "").split(";")
    period = int(meta.get("metricStatPeriod") or 300)
    now = datetime.datetime.now(datetime.UTC)
    query = {"Id": "c1", "ReturnData": True, "MetricStat": {
        "Metric": {"Namespace": str(meta["namespace"]), "MetricName": str(meta["metricName"]),
                   "Dimensions": [{"Name": n, "Value": v} for n, v in zip(names, values, strict=False)]},
        "Period": period, "Stat": str(meta.get("metricStat") or "Average")}}
    try:
        answer = _client(endpoint, str(meta["awsRegion"])).get_metric_data(
            MetricDataQueries=[query], ScanBy="TimestampDescending",
            StartTime=now - datetime.timedelta(seconds=int(meta.get("metricCollectionTime") or 300)),
            EndTime=now + datetime.timedelta(seconds=1))
    except Exception:  # an AWS refusal or the endpoint gone: no value this poll, as KEDA logs and goes on
        return None
    found = [float(v) for r in answer.get("MetricDataResults") or [] for v in r.get("Values") or []]
    return found[0] if found else float(meta.get("minMetricValue") or 0)
