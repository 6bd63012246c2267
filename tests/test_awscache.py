"""The AWS cache answers a failure from the cache too: a missing, denied or throttled resource costs one AWS
call per (short) TTL however often it is read, every reader gets the error, and an invalidation clears it."""

from __future__ import annotations

import threading

import pytest

from services.awscache import AwsCache
from services.clock import FakeClock
from services.errors import Forbidden, NotFound, ServiceError, Transient, classify_aws

KEY = ("sagemaker", "DescribeCluster", "us-west-2", "gone")


class Aws:
    """A load that answers what AWS would: an error response classified by the adapter's own rules."""

    def __init__(self, code: str, http_status: int = 400) -> None:
        self.code, self.http_status = code, http_status
        self.calls = 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        if self.code:
            raise classify_aws(self.code, "as AWS said it", self.http_status, "sagemaker:DescribeCluster")
        return {"ClusterName": "gone", "ClusterStatus": "InService"}


def test_a_missing_resource_is_fetched_once_per_ttl() -> None:
    clock = FakeClock()
    cache = AwsCache(clock, ttl=15)
    aws = Aws("ResourceNotFound")
    for _ in range(100):
        with pytest.raises(NotFound, match="as AWS said it"):
            cache.get(KEY, aws)
        clock.advance(0.1)  # 100 reads within 10 s, inside one TTL
    assert aws.calls == 1 and cache.loads[("sagemaker", "DescribeCluster")] == 1
    clock.advance(5.1)  # past the TTL: asked again
    with pytest.raises(NotFound):
        cache.get(KEY, aws)
    assert aws.calls == 2


def test_a_throttled_read_is_cached_for_its_retry_delay_only() -> None:
    clock = FakeClock()
    cache = AwsCache(clock, ttl=15)
    aws = Aws("ThrottlingException")
    for _ in range(10):
        with pytest.raises(Transient) as raised:
            cache.get(KEY, aws)
    assert aws.calls == 1
    delay = raised.value.delay
    assert 0 < delay < 15 and cache.error_ttl(raised.value) == delay
    clock.advance(delay)
    aws.code = ""  # AWS answers again
    value, age = cache.get(KEY, aws)
    assert value["ClusterStatus"] == "InService" and age == 0.0 and aws.calls == 2


def test_an_invalidation_clears_a_cached_failure() -> None:
    cache = AwsCache(FakeClock(), ttl=15)
    aws = Aws("AccessDeniedException")
    with pytest.raises(Forbidden):
        cache.get(KEY, aws)
    aws.code = ""  # the policy was fixed, and the operation that fixed it invalidates the cluster's entries
    cache.invalidate("us-west-2", "gone")
    assert cache.get(KEY, aws)[0]["ClusterName"] == "gone" and aws.calls == 2


def test_concurrent_misses_of_a_failing_key_make_one_call() -> None:
    cache = AwsCache(FakeClock(), ttl=15)
    gate = threading.Event()
    aws = Aws("ResourceNotFound")

    def slow() -> dict[str, str]:
        assert gate.wait(30)
        return aws()

    seen: list[str] = []

    def read() -> None:
        try:
            cache.get(KEY, slow)
        except ServiceError as exc:
            seen.append(exc.code)

    readers = [threading.Thread(target=read) for _ in range(10)]
    for t in readers:
        t.start()
    gate.set()
    for t in readers:
        t.join(30)
    assert aws.calls == 1 and seen == ["not_found"] * 10


def test_a_failure_is_not_cached_past_an_invalidation_made_while_loading() -> None:
    cache = AwsCache(FakeClock(), ttl=15)
    started, finish = threading.Event(), threading.Event()
    aws = Aws("ResourceNotFound")

    def slow() -> dict[str, str]:
        started.set()
        assert finish.wait(30)
        return aws()

    seen: list[str] = []

    def read() -> None:
        try:
            cache.get(KEY, slow)
        except NotFound as exc:
            seen.append(exc.code)

    reader = threading.Thread(target=read)
    reader.start()
    assert started.wait(30)
    cache.invalidate("us-west-2", "gone")  # the create that makes the resource lands meanwhile
    finish.set()
    reader.join(30)
    assert seen == ["not_found"]
    aws.code = ""
    assert cache.get(KEY, aws)[0]["ClusterName"] == "gone"
