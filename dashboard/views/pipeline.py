"""Pipeline health: ingest per partition, dead letters, last event, events per minute."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import streamlit as st

from consumers.reader import ApiReader
from dashboard import ui
from dashboard.data import load_pipeline

st.title("Pipeline health")
RECENT_MINUTES = 15


def consumer_lag() -> dict[tuple[str, int], int]:
    """Messages between the materializer's position and the end of each partition, from its
    /metrics (only through the read API; a store file does not know the broker's end)."""
    cfg = ui.config()
    if cfg.api is None:
        return {}
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    token = ui.access().token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(cfg.api.rstrip("/") + "/metrics", headers=headers)  # noqa: S310 (http(s) checked)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310 (http(s) checked)
            text = response.read().decode()
    except OSError:
        return {}
    lags: dict[tuple[str, int], int] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "callgate_consumer_lag":
            for sample in family.samples:
                lags[(sample.labels["topic"], int(sample.labels["partition"]))] = int(sample.value)
    return lags


def recent_rate(health: dict[str, Any], minutes: int) -> float:
    """Events stored a minute over the last `minutes`, counting only the minutes since the first
    event was stored (at least one): a pipeline started five minutes ago is not averaged over fifteen."""
    recent = float(health.get("recent_events") or 0)
    ran = health.get("recent_minutes")
    return recent / max(1.0, min(float(minutes), float(ran) if ran is not None else float(minutes)))


def health_of_materializer() -> dict[str, Any] | None:
    cfg = ui.config()
    if cfg.api is None:
        return None
    try:
        return ApiReader(cfg.api, timeout_s=5, token=ui.access().token).health()
    except Exception:  # an unreachable API is reported by the queries below
        return None


@st.fragment(run_every=ui.run_every())
def live() -> None:
    with ui.problems():
        if not ui.ready(allow_empty=True):
            return
        data = load_pipeline(ui.query, minutes=RECENT_MINUTES)
        health = data.health
        materializer = health_of_materializer()
        if materializer is not None:
            if materializer.get("status") == "ok":
                st.success("The materializer reports ok.")
            else:
                st.error("The materializer reports a problem.")
                st.text(str(materializer.get("detail") or ""))
        figures = st.columns(6)
        figures[0].metric("Events stored", f"{int(health.get('total_events') or 0):,}")
        per_minute = recent_rate(health, RECENT_MINUTES)
        figures[1].metric(
            "Events a minute",
            f"{per_minute:,.0f}",
            help=f"Stored a minute over the last {RECENT_MINUTES} minutes, or since the first event was "
            "stored if that is more recent (at least a minute).",
        )
        since_ingest = health.get("seconds_since_last_ingest")
        figures[2].metric("Since last ingest", "never" if since_ingest is None else f"{float(since_ingest):.0f} s")
        figures[3].metric("Dead letters", f"{int(health.get('dead_letters') or 0):,}")
        figures[4].metric("Chain breaks", f"{int(health.get('chain_breaks') or 0):,}")
        lag = consumer_lag()
        figures[5].metric("Consumer lag (messages)", f"{sum(lag.values()):,}" if lag else "n/a")
        last = health.get("last_event_time")
        st.caption(f"Last event time ({ui.zone()[1]})")
        st.code(ui.local_time(str(last)) if last else "(none)", language=None)

        st.subheader("Partitions")
        rows = [{**row, "lag_messages": lag.get((row["topic"], row["partition"]))} for row in data.partitions]
        ui.table(
            rows,
            [
                "topic",
                "partition",
                "next_offset",
                "lag_messages",
                "seconds_since_commit",
                "recent_events",
                "median_delay_s",
                "p95_delay_s",
                "max_delay_s",
                "last_event_time",
                "last_ingested_at",
            ],
            empty="No partition consumed yet.",
        )
        st.caption(
            f"Delay: from the decision to the store, over what was ingested in the last {RECENT_MINUTES} minutes. "
            "Lag in messages comes from the materializer's metrics (read API only)."
        )

        st.subheader("Events per minute (last hour, by event time)")
        if data.per_minute:
            minutes = [
                {"bucket": row["minute"], "events": row["events"], "stored": "events"} for row in data.per_minute
            ]
            now = datetime.now(UTC)
            ui.time_chart(
                minutes,
                value="events",
                color="stored",
                seconds=60,
                title="events",
                span=(now - timedelta(hours=1), now),
            )
        else:
            st.caption("No events in the last hour.")

        st.subheader("Dead letters")
        ui.table(
            data.dead_letters,
            [
                "reason",
                "messages",
                "first_received",
                "last_received",
                "sample_error",
                "sample_preview",
                "sample_position",
            ],
            empty="No dead letters.",
        )
        if data.dead_letter_sample:
            st.caption("The latest dead letters (values shown as text)")
            ui.table(
                data.dead_letter_sample,
                ["received_at", "topic", "partition", "offset", "reason", "error", "preview", "key", "value_bytes"],
            )


live()
