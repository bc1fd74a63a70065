"""The call counter contract, run against both counters by subclassing; then each one's own; then RateLimit."""

from __future__ import annotations

import fnmatch
import math
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from interceptor_core import Gate, RunContext, Tool, tool
from interceptor_core.builtins.counters import KEYS, CallCounter, InProcessCounter, RateLimit, RedisCounter
from interceptor_core.exceptions import ConfigurationError

T0 = 1_700_000_000.0
ACME_U1 = RunContext(tenant="acme", principal="u-1", run_id="run-1")
ACME_U2 = RunContext(tenant="acme", principal="u-2", run_id="run-2")
GLOBEX_U1 = RunContext(tenant="globex", principal="u-1", run_id="run-3")


def same_value(run: RunContext, other: RunContext, key: str) -> bool:
    """Whether two runs share the value of `key` (the rule the counters implement, spelled out)."""
    fields = {"tenant": "tenant", "principal": "principal", "run": "run_id"}
    return key == "global" or getattr(run, fields[key]) == getattr(other, fields[key])


class FakeClock:
    """A clock that moves only when a test moves it."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class CounterContract:
    """What every `CallCounter` promises. Subclasses provide `make`."""

    clock: FakeClock

    @pytest.fixture(autouse=True)
    def _fresh_clock(self) -> None:
        self.clock = FakeClock()

    def make(self, *, retention_s: float = 3600.0) -> CallCounter:
        raise NotImplementedError

    def test_window_is_open_at_its_start_and_counts_later_records(self) -> None:
        """A call exactly `window_s` before `at` is out; one at `at` is in, and so is one recorded
        later than `at` (a concurrent call whose clock read later), so neither can slip past a limit."""
        counter = self.make()
        for i, at in enumerate((T0 - 10, T0 - 5, T0, T0 + 1)):
            counter.record("search", ACME_U1, f"c{i}", at)
        assert counter.count("search", "tenant", ACME_U1, 10, T0) == 3
        assert counter.count("search", "tenant", ACME_U1, 10.001, T0) == 4
        assert counter.count("search", "tenant", ACME_U1, 0.5, T0 - 5) == 3
        assert counter.count("search", "tenant", ACME_U1, 3600, T0 + 1) == 4

    def test_same_call_id_counts_once(self) -> None:
        """Recording a call again, even at another time, counts it once, at the time first recorded."""
        counter = self.make()
        counter.record("search", ACME_U1, "same", T0 - 100)
        counter.record("search", ACME_U1, "same", T0)
        counter.record("search", ACME_U1, "same", T0)
        assert counter.count("search", "tenant", ACME_U1, 3600, T0) == 1
        assert counter.count("search", "tenant", ACME_U1, 50, T0) == 0

    def test_the_same_call_id_for_another_tool_is_another_call(self) -> None:
        """An id is one call of one tool: another tool sending the same id (ids a framework or a model
        repeats) is counted for that tool, never skipped."""
        counter = self.make()
        counter.record("search", ACME_U1, "call_0", T0)
        counter.record("send_email", ACME_U1, "call_0", T0)
        assert counter.count("send_email", "tenant", ACME_U1, 60, T0) == 1
        assert counter.count("*", "global", ACME_U1, 60, T0) == 2

    def test_globs_match_tools_as_fnmatchcase_does(self) -> None:
        """A glob counts the calls of every tool it matches, case-sensitively; an exact name only its own."""
        counter = self.make()
        for i, name in enumerate(("search_web", "search_docs", "search_docs", "send_email", "Search_x")):
            counter.record(name, ACME_U1, f"c{i}", T0)
        expected = {"search_*": 3, "*": 5, "send_email": 1, "search_?ocs": 2, "[st]*": 4, "SEARCH_*": 0, "nope": 0}
        assert {glob: counter.count(glob, "global", ACME_U1, 60, T0) for glob in expected} == expected

    def test_each_key_counts_its_own_calls(self) -> None:
        """tenant, principal and run count the calls sharing that value with the asking run; global counts all."""
        counter = self.make()
        for i, run in enumerate((ACME_U1, ACME_U1, ACME_U2, GLOBEX_U1)):
            counter.record("search", run, f"c{i}", T0)
        counts = {key: counter.count("search", key, ACME_U1, 60, T0) for key in KEYS}
        assert counts == {"tenant": 3, "principal": 3, "run": 2, "global": 4}
        assert counter.count("search", "tenant", GLOBEX_U1, 60, T0) == 1
        assert counter.count("search", "principal", ACME_U2, 60, T0) == 1

    def test_runs_without_a_tenant_share_a_bucket_of_their_own(self) -> None:
        """Runs with no tenant count together, apart from tenants named "" or "None"."""
        counter = self.make()
        anonymous = [RunContext(), RunContext(), RunContext(principal="u-9")]
        for i, run in enumerate([*anonymous, RunContext(tenant=""), RunContext(tenant="None")]):
            counter.record("search", run, f"c{i}", T0)
        assert counter.count("search", "tenant", RunContext(), 60, T0) == 3
        assert counter.count("search", "tenant", RunContext(tenant=""), 60, T0) == 1
        assert counter.count("search", "tenant", RunContext(tenant="None"), 60, T0) == 1
        assert counter.count("search", "principal", RunContext(), 60, T0) == 4  # all but u-9

    def test_separators_in_names_do_not_mix_buckets(self) -> None:
        """Tenants and tools containing ":" or "%" are counted apart from the names they would spell when joined."""
        counter = self.make()
        pairs = [("a:t:b", "c"), ("a", "b:t:c"), ("x:y", "z"), ("x%3Ay", "z"), ("a:tools", "q")]
        for i, (tenant, name) in enumerate(pairs):
            counter.record(name, RunContext(tenant=tenant), f"c{i}", T0)
        for tenant, name in pairs:
            assert counter.count(name, "tenant", RunContext(tenant=tenant), 60, T0) == 1, (tenant, name)
            assert counter.count("*", "tenant", RunContext(tenant=tenant), 60, T0) == 1, tenant

    def test_a_bucket_never_written_counts_zero(self) -> None:
        """Counting for a tenant or a tool with no calls gives 0, for an exact name and for a glob."""
        counter = self.make()
        counter.record("search", ACME_U1, "c1", T0)
        assert counter.count("search", "tenant", GLOBEX_U1, 60, T0) == 0
        assert counter.count("other*", "tenant", ACME_U1, 60, T0) == 0
        assert counter.count("other", "tenant", ACME_U1, 60, T0) == 0

    def test_calls_recorded_out_of_order_are_counted(self) -> None:
        """Timestamps arriving out of order (threads racing) are counted by their time, not their arrival."""
        counter = self.make()
        for i, at in enumerate((T0, T0 - 30, T0 - 1, T0 - 50)):
            counter.record("search", ACME_U1, f"c{i}", at)
        assert counter.count("search", "run", ACME_U1, 40, T0) == 3
        assert counter.count("search", "run", ACME_U1, 20, T0 - 1) == 2

    def test_records_from_several_threads_are_all_counted(self) -> None:
        """Eight threads recording at once lose no call."""
        counter = self.make()

        def work(n: int) -> None:
            for i in range(50):
                counter.record(f"tool_{i % 3}", ACME_U1, f"t{n}-{i}", T0 - i * 0.01)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert counter.count("tool_*", "tenant", ACME_U1, 60, T0) == 400

    def test_an_unknown_key_is_refused_by_name(self) -> None:
        """A key other than tenant, principal, run and global raises ValueError naming it."""
        counter = self.make()
        with pytest.raises(ValueError, match="'workflow'"):
            counter.count("search", "workflow", ACME_U1, 60, T0)

    @pytest.mark.parametrize("window_s", [0, -1, math.nan, 3600.5])
    def test_a_window_that_is_not_positive_or_longer_than_retention_is_refused(self, window_s: float) -> None:
        """window_s <= 0, NaN and a window past what the counter keeps raise ValueError."""
        counter = self.make(retention_s=3600)
        with pytest.raises(ValueError, match="window_s"):
            counter.count("search", "tenant", ACME_U1, window_s, T0)

    # Each subclass runs this one test with its own `self` (that is the contract suite's design), and
    # `make` builds a fresh counter per example, so neither health check applies.
    @settings(
        max_examples=40,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors],
    )
    @given(
        calls=st.lists(
            st.tuples(
                st.sampled_from(["a", "ab", "b"]), st.sampled_from([ACME_U1, ACME_U2, GLOBEX_U1]), st.integers(0, 20)
            ),
            max_size=30,
        ),
        glob=st.sampled_from(["a", "a*", "*", "?", "b"]),
        key=st.sampled_from(KEYS),
        window=st.integers(1, 25),
        at=st.integers(0, 25),
    )
    def test_count_is_a_filter_over_the_recorded_calls(
        self,
        calls: list[tuple[str, RunContext, int]],
        glob: str,
        key: str,
        window: int,
        at: int,
    ) -> None:
        """For any calls, a count equals the number of recorded calls since the window opened, of a matching tool,
        by the key."""
        counter = self.make()
        for i, (name, run, t) in enumerate(calls):
            counter.record(name, run, f"c{i}", T0 + t)
        expected = sum(
            1
            for name, run, t in calls
            if fnmatch.fnmatchcase(name, glob) and same_value(run, ACME_U1, key) and at - window < t
        )
        assert counter.count(glob, key, ACME_U1, window, T0 + at) == expected


class TestInProcessCounter(CounterContract):
    def make(self, *, retention_s: float = 3600.0) -> InProcessCounter:
        return InProcessCounter(clock=self.clock, retention_s=retention_s)

    def test_expired_runs_leave_nothing_behind(self) -> None:
        """After the retention passes, a thousand finished runs' buckets, timestamps and call ids are gone."""
        counter = self.make(retention_s=60)
        for i in range(1000):
            counter.record("search", RunContext(tenant=f"t{i % 10}", principal=f"u{i}"), f"c{i}", T0)
        assert counter.footprint().buckets == 1000 + 10 + 1000 + 1
        self.clock.now = T0 + 60 + 60 / 8 + 1
        counter.record("search", ACME_U1, "late", self.clock.now)
        footprint = counter.footprint()
        assert (footprint.buckets, footprint.timestamps, footprint.call_ids) == (4, 4, 1)
        assert counter.count("search", "global", ACME_U1, 60, self.clock.now) == 1

    def test_a_busy_bucket_is_trimmed_to_the_retention(self) -> None:
        """A bucket recorded into all along keeps only its calls younger than the retention."""
        counter = self.make(retention_s=80)
        for second in range(400):
            self.clock.now = T0 + second
            counter.record("search", ACME_U1, f"c{second}", self.clock.now)
        # The sweep runs every retention / 8 (10 s): at most that much older history remains.
        assert 80 * 4 <= counter.footprint().timestamps <= 90 * 4
        assert counter.footprint().call_ids <= 90
        assert counter.count("search", "run", ACME_U1, 80, self.clock.now) == 80

    def test_an_id_seen_again_after_the_retention_counts_again(self) -> None:
        """Idempotence lasts as long as the retention: an id that old is a new call."""
        counter = self.make(retention_s=8)
        counter.record("search", ACME_U1, "c1", T0)
        self.clock.now = T0 + 20
        counter.record("search", ACME_U1, "c1", self.clock.now)
        assert counter.count("search", "run", ACME_U1, 8, self.clock.now) == 1

    def test_a_retention_that_is_not_positive_is_a_configuration_error(self) -> None:
        """retention_s of 0 or infinity is refused when the counter is built."""
        for retention_s in (0, -5, math.inf):
            with pytest.raises(ConfigurationError, match="retention_s"):
                InProcessCounter(retention_s=retention_s)


class TestRedisCounter(CounterContract):
    url: str

    @pytest.fixture(autouse=True)
    def _redis(self, redis_url: str) -> Iterator[None]:
        self.url = redis_url
        self.prefix = f"test:{uuid.uuid4().hex}:"
        self.made: list[RedisCounter] = []
        yield
        for counter in self.made:
            counter.close()

    def make(self, *, retention_s: float = 3600.0, prefix: str | None = None) -> RedisCounter:
        """A counter on the test's Redis; with no `prefix`, a fresh one (a hypothesis example's own)."""
        prefix = prefix or f"{self.prefix}{uuid.uuid4().hex[:8]}:"
        counter = RedisCounter(self.url, prefix=prefix, retention_s=retention_s)
        self.made.append(counter)
        return counter

    def keys(self) -> list[str]:
        with redis.Redis.from_url(self.url, decode_responses=True) as client:
            return sorted(client.scan_iter(f"{self.prefix}*"))

    def test_two_counters_on_one_redis_share_counts(self) -> None:
        """Calls recorded through one counter are counted by another on the same Redis and prefix."""
        first, second = self.make(prefix=self.prefix), self.make(prefix=self.prefix)
        first.record("search", ACME_U1, "c1", T0)
        second.record("search", ACME_U2, "c2", T0)
        assert first.count("search", "tenant", ACME_U1, 60, T0) == 2
        assert second.count("search*", "tenant", ACME_U1, 60, T0) == 2

    def test_another_prefix_is_another_count(self) -> None:
        """Counters with different prefixes on one Redis do not see each other's calls."""
        mine, theirs = self.make(prefix=self.prefix), self.make(prefix=f"{self.prefix}other:")
        theirs.record("search", ACME_U1, "c1", T0)
        assert mine.count("search", "tenant", ACME_U1, 60, T0) == 0

    def test_a_second_process_shares_the_count(self) -> None:
        """Calls a separate Python process records are counted here."""
        code = (
            "import sys\n"
            "from interceptor_core import RunContext\n"
            "from interceptor_core.builtins.counters import RedisCounter\n"
            "counter = RedisCounter(sys.argv[1], prefix=sys.argv[2])\n"
            "run = RunContext(tenant='acme', principal='u-7')\n"
            "for i in range(3):\n"
            "    counter.record('search', run, f'child-{i}', float(sys.argv[3]))\n"
            "counter.close()\n"
        )
        subprocess.run([sys.executable, "-c", code, self.url, self.prefix, repr(T0)], check=True, timeout=60)
        counter = self.make(prefix=self.prefix)
        counter.record("search", ACME_U1, "parent", T0)
        assert counter.count("search", "tenant", ACME_U1, 60, T0) == 4
        assert counter.count("search", "principal", ACME_U1, 60, T0) == 1

    def test_keys_are_escaped_prefixed_and_expire(self) -> None:
        """Every key starts with the prefix, holds no raw ":" from a name, and expires within the retention."""
        counter = self.make(retention_s=120, prefix=self.prefix)
        counter.record("files:read", RunContext(tenant="a:b", principal="p", run_id="r"), "c1", T0)
        keys = self.keys()
        assert f"{self.prefix}tenant:=a%3Ab:t:files%3Aread" in keys
        assert f"{self.prefix}tenant:=a%3Ab:tools" in keys
        assert f"{self.prefix}global:-:t:files%3Aread" in keys
        assert len(keys) == 8
        with redis.Redis.from_url(self.url) as client:
            assert all(0 < client.pttl(key) <= 120_000 for key in keys)

    def test_old_calls_are_trimmed_when_a_new_one_is_recorded(self) -> None:
        """A record drops the calls of its buckets older than the retention, so a busy key stays small."""
        counter = self.make(retention_s=60, prefix=self.prefix)
        for i in range(5):
            counter.record("search", ACME_U1, f"old-{i}", T0)
        counter.record("search", ACME_U1, "new", T0 + 61)
        with redis.Redis.from_url(self.url) as client:
            assert client.zcard(f"{self.prefix}run:=run-1:t:search") == 1

    def test_a_redis_that_lost_its_scripts_still_records(self) -> None:
        """After SCRIPT FLUSH (a restarted Redis), record loads its script again and counts on."""
        counter = self.make()
        counter.record("search", ACME_U1, "c1", T0)
        with redis.Redis.from_url(self.url) as client:
            client.script_flush()
        counter.record("search", ACME_U1, "c2", T0)
        assert counter.count("search", "run", ACME_U1, 60, T0) == 2

    def test_a_redis_that_is_down_raises_connection_error(self, closed_redis_url: str) -> None:
        """Recording or counting against a closed port raises redis's ConnectionError, not a quiet zero."""
        counter = RedisCounter(closed_redis_url, prefix=self.prefix, timeout_s=2)
        try:
            with pytest.raises(redis.exceptions.ConnectionError):
                counter.record("search", ACME_U1, "c1", T0)
            with pytest.raises(redis.exceptions.ConnectionError):
                counter.count("search*", "tenant", ACME_U1, 60, T0)
        finally:
            counter.close()

    def test_a_client_given_is_used_and_left_open(self) -> None:
        """A counter built on a caller's client uses it and leaves it open on close()."""
        with redis.Redis.from_url(self.url) as client:
            counter = RedisCounter(client=client, prefix=self.prefix)
            counter.record("search", ACME_U1, "c1", T0)
            counter.close()
            assert counter.count("search", "run", ACME_U1, 60, T0) == 1
            assert client.ping()


@pytest.fixture
def ran() -> list[str]:
    return []


@pytest.fixture
def search(ran: list[str]) -> Tool[Any, Any]:
    @tool
    def search(query: str) -> str:
        """Searches the web."""
        ran.append(query)
        return f"results for {query}"

    return search


@pytest.fixture
def fetch(ran: list[str]) -> Tool[Any, Any]:
    @tool
    def fetch(url: str) -> str:
        """Fetches a page."""
        ran.append(url)
        return "page"

    return fetch


def desk(*tools: Tool[Any, Any], limit: RateLimit) -> Any:
    return Gate("shop", interceptors=[limit]).agent("desk", tools=list(tools))


class TestRateLimit:
    async def test_the_call_past_the_limit_is_denied_and_its_tool_never_runs(
        self, search: Tool[Any, Any], ran: list[str]
    ) -> None:
        """With limit 3, three calls in the window run and the fourth is denied before the tool."""
        agent = desk(search, limit=RateLimit("search", limit=3, window_s=60, clock=FakeClock()))
        results = [await agent.call("search", {"query": f"q{i}"}, run=ACME_U1) for i in range(4)]
        assert [r.kind for r in results] == ["ok", "ok", "ok", "denied"]
        assert ran == ["q0", "q1", "q2"]
        assert results[3].decided_by == "rate-limit"
        assert results[3].message == (
            "search is limited to 3 calls per tenant in 1 min, and that limit is reached; "
            "wait before calling it again (calls made over the limit count too), or do without it."
        )

    async def test_the_window_moves_on_and_denied_calls_count(self, search: Tool[Any, Any], ran: list[str]) -> None:
        """Calls leave the count after window_s, and a denied call counts as long as an allowed one."""
        clock = FakeClock()
        agent = desk(search, limit=RateLimit("search", limit=2, window_s=10, clock=clock))
        kinds = []
        # At 10.5 the window (0.5, 10.5] still holds 1 and the denied 2; at 12.5 only 10.5 is left.
        for t in (0, 1, 2, 10.5, 12.5, 13):
            clock.now = T0 + t
            kinds.append((await agent.call("search", {"query": str(t)}, run=ACME_U1)).kind)
        assert kinds == ["ok", "ok", "denied", "denied", "ok", "denied"]
        assert ran == ["0", "1", "12.5"]

    async def test_only_matching_tools_are_limited(self, search: Tool[Any, Any], fetch: Tool[Any, Any]) -> None:
        """A limit on a glob leaves the other tools alone and does not count their calls."""
        counter = InProcessCounter()
        agent = desk(search, fetch, limit=RateLimit("sea*", limit=1, window_s=60, counter=counter))
        assert (await agent.call("fetch", {"url": "u1"}, run=ACME_U1)).ok
        assert (await agent.call("fetch", {"url": "u2"}, run=ACME_U1)).ok
        assert (await agent.call("search", {"query": "q"}, run=ACME_U1)).ok
        assert not (await agent.call("search", {"query": "q"}, run=ACME_U1)).ok
        assert counter.count("*", "global", ACME_U1, 60, time.time()) == 2

    async def test_each_key_value_has_its_own_allowance(self, search: Tool[Any, Any]) -> None:
        """With key="run", every run gets `limit` calls of its own."""
        agent = desk(search, limit=RateLimit("search", limit=1, window_s=60, key="run"))
        kinds = [(await agent.call("search", {"query": "q"}, run=run)).kind for run in (ACME_U1, ACME_U2, ACME_U1)]
        assert kinds == ["ok", "ok", "denied"]

    async def test_a_custom_message_is_what_the_model_reads(self, search: Tool[Any, Any]) -> None:
        """`message` replaces the default denial text."""
        limit = RateLimit("search", limit=0, window_s=60, message="No searching on the free plan.")
        result = await desk(search, limit=limit).call("search", {"query": "q"}, run=ACME_U1)
        assert (result.kind, result.message) == ("denied", "No searching on the free plan.")

    async def test_a_limit_shared_through_redis_holds_across_gates(
        self, search: Tool[Any, Any], ran: list[str], redis_url: str
    ) -> None:
        """Two gates with RedisCounters on one Redis and prefix share one allowance."""
        prefix = f"test:{uuid.uuid4().hex}:"
        counters = [RedisCounter(redis_url, prefix=prefix) for _ in range(2)]
        try:
            agents = [desk(search, limit=RateLimit("search", limit=3, window_s=60, counter=c)) for c in counters]
            kinds = [(await agents[i % 2].call("search", {"query": f"q{i}"}, run=ACME_U1)).kind for i in range(5)]
        finally:
            for counter in counters:
                counter.close()
        assert kinds == ["ok", "ok", "ok", "denied", "denied"]
        assert ran == ["q0", "q1", "q2"]

    async def test_a_redis_that_is_down_fails_closed(
        self, search: Tool[Any, Any], ran: list[str], closed_redis_url: str
    ) -> None:
        """When the counter cannot reach Redis the gate denies the call and the tool does not run."""
        counter = RedisCounter(closed_redis_url)
        try:
            result = await desk(search, limit=RateLimit("search", limit=5, window_s=60, counter=counter)).call(
                "search", {"query": "q"}, run=ACME_U1
            )
        finally:
            counter.close()
        assert (result.kind, result.decided_by) == ("denied", "rate-limit")
        assert "could not be completed" in (result.message or "")
        assert ran == []

    @pytest.mark.parametrize(
        ("options", "culprit"),
        [
            ({"tool_glob": ""}, "tool_glob"),
            ({"limit": -1}, "limit"),
            ({"limit": 2.5}, "limit"),
            ({"limit": True}, "limit"),
            ({"window_s": 0}, "window_s"),
            ({"window_s": math.inf}, "window_s"),
            ({"key": "workflow"}, "key"),
            ({"counter": object()}, "counter"),
            ({"counter": InProcessCounter(retention_s=30)}, "retention_s"),
            ({"message": 42}, "message"),
            ({"name": ""}, "name"),
            ({"mandatory": "yes"}, "mandatory"),
        ],
    )
    def test_bad_configuration_is_refused_by_name(self, options: dict[str, Any], culprit: str) -> None:
        """Each bad argument raises ConfigurationError naming it, when the limit is built."""
        arguments: dict[str, Any] = {"tool_glob": "search", "limit": 1, "window_s": 60, **options}
        with pytest.raises(ConfigurationError, match=culprit):
            RateLimit(arguments.pop("tool_glob"), **arguments)
