"""Staying registered: Toolport killed and restarted, the plugin's origin evicted, a clean stop."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator

import aiohttp
import pytest

from toolport_plugin import Plugin, PluginError, RegisteredEvent

from .conftest import REPO, Api, Toolport, start_toolport, unstarted_toolport

EXAMPLE = REPO / "examples" / "weather_plugin_sdk.py"


def new_plugin(api: Api, **options: object) -> Plugin:
    options.setdefault("poll_interval", 0.3)
    return Plugin(f"test-{uuid.uuid4().hex[:8]}", toolport_url=api.tp.url, **options)  # type: ignore[arg-type]


async def has_events(api: Api) -> bool:
    async with api.session.get(api.tp.url + "/api/events") as res:
        return res.status == 200


async def test_toolport_killed_and_restarted_gets_the_tools_back(own_api: Api) -> None:
    api = own_api
    # Toolport may take seconds to boot on a busy machine; a 1 s cap on the backoff keeps the
    # plugin's retries close behind it, so the printed figure is about the SDK, not the boot.
    plugin = new_plugin(api, max_backoff=1.0)
    restored: list[RegisteredEvent] = []
    plugin.on("registered", restored.append)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    async with plugin:
        assert await api.names() == ["echo"]
        api.tp.kill()  # SIGKILL: no goodbye, every registration gone (docs/protocol.md R3)
        await asyncio.sleep(0.5)  # the plugin sees Toolport gone for a moment
        await asyncio.to_thread(api.tp.start)  # the same port, an empty registry
        took = await api.wait_for(lambda: _has(api, "echo"), timeout=10, what="echo registered again")
        print(f"tools back {took:.2f} s after Toolport listened again (watch mode: {plugin.watch_mode})")
        assert (await api.call("echo", {"text": "back"}))["output"] == "back"
        assert [e.reason for e in restored] == ["start", "restored"]
        assert restored[1].names == ["echo"]
        assert restored[1].roles == ["default"]
        # Toolport offers the event stream: the plugin follows it again after the restart.
        assert await has_events(api)
        await api.wait_for(lambda: _mode(plugin, "events"), timeout=10, what="the event stream followed")


async def test_with_the_event_stream_a_restart_is_repaired_without_polling(own_api: Api) -> None:
    api = own_api
    if not await has_events(api):
        pytest.skip("this Toolport has no GET /api/events yet; the polling path is tested above")
    # Checks only every 60 s: only the event stream can bring the tools back in time.
    plugin = new_plugin(api, poll_interval=60, resync_interval=60)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    async with plugin:
        await api.wait_for(lambda: _mode(plugin, "events"), timeout=10, what="the event stream followed")
        before = plugin._watch.instance_id
        assert before is not None
        api.tp.kill()
        await asyncio.to_thread(api.tp.start)
        await api.wait_for(lambda: _has(api, "echo"), timeout=10, what="echo registered again")
        assert plugin._watch.instance_id not in (None, before)


async def test_an_evicted_origin_gets_its_tools_back(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    async with plugin:
        assert "echo" in await api.names()
        # The plugin's server stops answering: Toolport's calls fail to connect, and after three
        # such failures it evicts every plugin: tool at this origin (docs/protocol.md R13).
        await plugin._server._suspend()
        for _ in range(10):
            result = await api.call("echo", {"text": "x"})
            assert result["is_error"] is True
            if "echo" not in await api.names():
                break
        await plugin._server._resume()
        await api.wait_for(lambda: _has(api, "echo"), timeout=10, what="echo registered again")
        assert (await api.call("echo", {"text": "back"}))["output"] == "back"


async def test_a_clean_stop_clears_the_source(api: Api) -> None:
    plugin = new_plugin(api)

    @plugin.tool
    async def one() -> int:
        return 1

    @plugin.tool
    async def two() -> int:
        return 2

    started = await plugin.start()
    assert started.names == ["one", "two"]
    assert sorted(started.roles) == ["Mochi", "default"]
    for role, rows in (await api.tools()).items():
        assert {"one", "two"} <= {r["name"] for r in rows}, role
    stopped = await plugin.stop()
    assert (stopped.is_cleared, stopped.removed, stopped.error) == (True, 4, None)
    for rows in (await api.tools()).values():
        assert not [r for r in rows if r["source"] == plugin.source]
    # The callback server is closed too.
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as s:
            await s.post(started.url + "/", json={})


async def test_start_waits_for_a_toolport_that_is_not_up_yet() -> None:
    tp = unstarted_toolport(["default"])
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(session, tp)
            plugin = new_plugin(api, start_timeout=30)

            @plugin.tool
            async def echo(text: str) -> str:
                return text

            starting = asyncio.create_task(plugin.start())
            await asyncio.sleep(0.5)
            assert not starting.done()
            await asyncio.to_thread(tp.start)
            result = await asyncio.wait_for(starting, 20)
            assert result.names == ["echo"]
            await plugin.stop()
            assert "echo" not in await api.names()
    finally:
        tp.stop()


@pytest.mark.timeout(120)
async def test_the_example_plugin_serves_survives_a_restart_and_clears_on_sigterm(own_api: Api) -> None:
    api = own_api
    env = {**os.environ, "TOOLPORT_URL": api.tp.url, "PYTHONPATH": str(REPO / "python" / "src")}
    proc = await asyncio.create_subprocess_exec(sys.executable, str(EXAMPLE), env=env,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        line = (await asyncio.wait_for(proc.stderr.readline(), 20)).decode()
        assert "registered 1 tool(s) of plugin:weather-sdk" in line, line
        result = await api.call("get_weather", {"city": "Oslo", "unit": "f"})
        assert result["output"] == {"city": "Oslo", "temperature": 27, "unit": "f"}
        result = await api.call("get_weather", {"city": "Atlantis"})
        assert (result["is_error"], result["error"]) == (True, "NO_DATA")

        api.tp.kill()
        await asyncio.to_thread(api.tp.start)
        # The example polls with the defaults (every 2 s, backing off while Toolport is down), so
        # a slow restart on a busy machine can take a few backoff steps: wait generously.
        await api.wait_for(lambda: _has(api, "get_weather"), timeout=45, what="get_weather registered again")

        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), 15) == 0
        assert "get_weather" not in await api.names()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _has(api: Api, name: str) -> bool:
    return name in await api.names()


async def _mode(plugin: Plugin, mode: str) -> bool:
    return plugin.watch_mode == mode


async def test_token_mode_sends_the_bearer_token_on_every_request(tmp_path: os.PathLike[str]) -> None:
    token_file = os.path.join(tmp_path, "token")
    with open(token_file, "w") as f:
        f.write(uuid.uuid4().hex + uuid.uuid4().hex)
    os.chmod(token_file, 0o600)
    tp = await asyncio.to_thread(start_toolport, ["default"], ["--token-file", token_file])
    try:
        refused = Plugin("no-token", toolport_url=tp.url)
        refused.tool(_echo)
        with pytest.raises(PluginError) as info:
            await refused.start()
        assert (info.value.code, info.value.status, info.value.toolport_code) == ("TP_ERR_PLUGIN_REFUSED", 401, "TP_ERR_UNAUTHORIZED")

        plugin = Plugin("with-token", toolport_url=tp.url, token_file=token_file, poll_interval=0.3)
        plugin.tool(_echo)
        async with plugin:
            with open(token_file) as f:
                headers = {"authorization": f"Bearer {f.read().strip()}"}
            async with aiohttp.ClientSession(headers=headers) as session:
                async with session.get(tp.url + "/api/tools?role=default") as res:
                    assert [t["name"] for t in (await res.json())["tools_by_role"]["default"]] == ["_echo"]
        async with aiohttp.ClientSession(headers=headers) as session:
            async with session.get(tp.url + "/api/tools?role=default") as res:
                assert (await res.json())["tools_by_role"]["default"] == []  # the stop's clear was authorised too
    finally:
        await asyncio.to_thread(tp.stop)


async def test_a_named_role_gets_the_tools_alone_and_only_its_registrations_are_cleared(api: Api) -> None:
    plugin = new_plugin(api, role="Mochi")
    plugin.tool(_echo)
    async with plugin:
        assert "_echo" in await api.names("Mochi")
        assert "_echo" not in await api.names("default")
    assert "_echo" not in await api.names("Mochi")


async def _echo(text: str) -> str:
    return text


@pytest.fixture
async def owned_toolport(tmp_path: os.PathLike[str]) -> AsyncIterator[Toolport]:
    """A Toolport of its own in ownership mode (``security.enforceOwnership``), role "default"."""
    config = os.path.join(tmp_path, "config.json")
    with open(config, "w") as f:
        f.write('{"security": {"enforceOwnership": true}}')
    tp = await asyncio.to_thread(start_toolport, ["default"], ["--config", config])
    try:
        yield tp
    finally:
        await asyncio.to_thread(tp.stop)


async def test_ownership_mode_binds_the_source_to_the_plugin_key(owned_toolport: Toolport) -> None:
    tp = owned_toolport
    with pytest.raises(PluginError) as bad_key:
        Plugin("owned", toolport_url=tp.url, plugin_key="short")
    assert bad_key.value.code == "TP_ERR_PLUGIN_OPTIONS"

    owner = Plugin("owned", toolport_url=tp.url, poll_interval=0.3)
    owner.tool(_echo)
    async with owner:
        # Another plugin claiming the same source (its own random key) is refused.
        thief = Plugin("owned", toolport_url=tp.url, start_timeout=0)
        thief.tool(_echo)
        with pytest.raises(PluginError) as info:
            await thief.start()
        assert (info.value.status, info.value.toolport_code) == (403, "TP_ERR_NOT_OWNER")
        async with aiohttp.ClientSession() as session:
            async with session.get(tp.url + "/api/tools?role=default") as res:
                assert [t["name"] for t in (await res.json())["tools_by_role"]["default"]] == ["_echo"]
    # The owner's clean stop was allowed to clear its source.
    async with aiohttp.ClientSession() as session:
        async with session.get(tp.url + "/api/tools?role=default") as res:
            assert (await res.json())["tools_by_role"]["default"] == []


async def test_run_in_another_thread_is_stopped_by_asyncio_run_of_stop_from_this_one(api: Api) -> None:
    """README "Python plugin SDK" → Life: outside the main thread only ``stop()`` ends ``run()``.
    Awaited on this thread's own loop, it is handed to the plugin's loop: the tools are cleared
    and ``run()`` returns (it raised "attached to a different loop", leaving the tools registered)."""
    plugin = new_plugin(api)
    plugin.tool(_echo)
    thread = threading.Thread(target=plugin.run, name="plugin-run")
    thread.start()
    try:
        async def registered() -> bool:
            return "_echo" in await api.names()
        await api.wait_for(registered, what="the tool registered")
        stopped = await asyncio.to_thread(asyncio.run, plugin.stop(grace=0))
        assert (stopped.is_cleared, stopped.error) == (True, None) and stopped.removed >= 1, stopped
        await asyncio.to_thread(thread.join, 20)
        assert not thread.is_alive()
        assert await api.names() == []
        # Once its loop is gone, another stop() says the same, and does not raise.
        again = await asyncio.to_thread(asyncio.run, plugin.stop())
        assert again == stopped
    finally:
        if thread.is_alive():
            await asyncio.to_thread(asyncio.run, plugin.stop(grace=0))


async def test_stop_after_the_loop_start_ran_on_ended_clears_the_tools(api: Api) -> None:
    """``asyncio.run(plugin.start())`` then ``asyncio.run(plugin.stop())``: the first loop took the
    callback server with it, but its tools are still registered; stop() clears them from its own
    loop instead of reporting a clean stop that left them there."""
    plugin = new_plugin(api)
    plugin.tool(_echo)
    await asyncio.to_thread(asyncio.run, plugin.start())
    assert "_echo" in await api.names()
    stopped = await asyncio.to_thread(asyncio.run, plugin.stop())
    assert (stopped.is_cleared, stopped.error) == (True, None) and stopped.removed >= 1, stopped
    assert await api.names() == []
    assert await asyncio.to_thread(asyncio.run, plugin.stop()) == stopped


async def test_a_name_another_source_holds_fails_start_at_once_naming_the_owner(owned_toolport: Toolport) -> None:
    """README "Python plugin SDK" → Start and stop: an answer that says the registration is wrong
    raises at once. A name every role refused because another source holds it (ownership mode) will
    not heal by waiting: no retrying for ``start_timeout``, and the reason is in the message."""
    tp = owned_toolport
    owner = Plugin("first-owner", toolport_url=tp.url, poll_interval=0.3)
    owner.tool(_echo)
    async with owner:
        # A start_timeout far beyond the hang guard: a retried refusal would fail the test.
        second = Plugin("second-comer", toolport_url=tp.url, start_timeout=600)
        second.tool(_echo)
        with pytest.raises(PluginError) as info:
            await asyncio.wait_for(second.start(), 20)
        assert info.value.code == "TP_ERR_PLUGIN_REFUSED"
        assert "(default: '_echo' belongs to source 'plugin:first-owner')" in info.value.message, info.value.message
        assert info.value.details == [{"path": "default", "message": "'_echo' belongs to source 'plugin:first-owner'"}]
        # Nothing of it was registered, so its failed start() sent no clear.
        stopped = await second.stop()
        assert (stopped.is_cleared, stopped.removed, stopped.error) == (False, 0, None)


async def test_stop_of_a_plugin_whose_role_is_gone_reports_a_clean_clear(own_api: Api) -> None:
    # Its one role went away (here: Toolport restarted without it) and every tool of its source
    # with it: stop() has nothing to clear and says so, as the TypeScript SDK does, instead of
    # reporting Toolport's TP_ERR_ROLE_NOT_FOUND as a failed clear.
    api = own_api
    plugin = new_plugin(api, role="default", max_backoff=1.0)

    @plugin.tool
    async def echo(text: str) -> str:
        return text

    await plugin.start()
    api.tp.kill()
    api.tp.roles = ["other"]
    await asyncio.to_thread(api.tp.start)  # the same port, without the role "default"
    stopped = await plugin.stop()
    assert (stopped.is_cleared, stopped.removed, stopped.error) == (True, 0, None)


async def test_a_tool_taken_over_by_another_instance_is_left_alone_and_the_warning_names_its_origin_only(
        api: Api, caplog: pytest.LogCaptureFixture) -> None:
    # README "Python plugin SDK" → Keeping registrations alive: a name taken over is left alone,
    # with one warning. Another instance of the same source is named by its callback's origin:
    # the callback's path holds that instance's random segment (R14), which no log may carry.
    first = new_plugin(api, role="default", use_events=False)
    first.tool(_echo)
    second = Plugin(first.source.removeprefix("plugin:"), toolport_url=api.tp.url, role="default")
    second.tool(_echo)
    async with first:
        async with second:
            secret = second.callback_url("_echo").split("/")[3]

            async def warned() -> bool:
                return any("another callback" in r.getMessage() for r in caplog.records)
            await api.wait_for(warned, what="the conflict warning")
            assert (await api.call("_echo", {"text": "b"}))["output"] == "b"
    warnings = [r.getMessage() for r in caplog.records if "another callback" in r.getMessage()]
    assert warnings == [f"'_echo' in role 'default' now belongs to another callback ({second.url}); leaving it alone"], warnings
    assert not any(secret in r.getMessage() for r in caplog.records)


async def test_a_start_that_could_not_connect_sends_no_clear_and_warns_of_none(caplog: pytest.LogCaptureFixture) -> None:
    """A registration that was never sent (no connection to Toolport) registered nothing: the
    failed start() and stop() send no clear, so Ctrl-C while Toolport is down warns of nothing."""
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plugin = Plugin(f"test-{uuid.uuid4().hex[:8]}", toolport_url=f"http://127.0.0.1:{port}", start_timeout=0)
    plugin.tool(_echo)
    with caplog.at_level(logging.WARNING, logger="toolport_plugin"):
        with pytest.raises(PluginError) as info:
            await plugin.start()
        assert info.value.code == "TP_ERR_PLUGIN_UNREACHABLE"
        stopped = await plugin.stop()
    assert (stopped.is_cleared, stopped.removed, stopped.error) == (False, 0, None)
    # The plugin's own log: asyncio may report another test's garbage here meanwhile.
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("toolport_plugin")]
    assert warned == []


async def test_other_sources_tools_past_the_answer_cap_do_not_keep_a_removed_tool_from_coming_back(
        tmp_path: os.PathLike[str]) -> None:
    """docs/protocol.md R18: a check lists only the plugin's own names, so another source's 66 MiB
    of descriptions (past the SDK's 64 MiB cap for one answer) cannot make every check fail."""
    config = os.path.join(tmp_path, "config.json")
    with open(config, "w") as f:
        json.dump({"limits": {"maxDescriptionChars": 1024 * 1024, "maxBodyBytes": 8 * 1024 * 1024}}, f)
    tp = await asyncio.to_thread(start_toolport, ["default"], ["--config", config])
    try:
        async with aiohttp.ClientSession() as session:
            api = Api(session, tp)
            # 11 tools of 1 MiB descriptions of U+0001 (six characters each in JSON): 66 MiB.
            for i in range(11):
                status, body = await api.post("/api/tools/register", {
                    "name": f"big_{i}", "description": "\u0001" * (1024 * 1024),
                    "callback_url": "http://127.0.0.1:9/big", "source": "plugin:big"})
                assert status == 200, body

            async def has_echo() -> bool:
                status, body = await api.get("/api/tools?role=default&name=_echo")
                return status == 200 and [t["name"] for t in body["tools_by_role"]["default"]] == ["_echo"]

            plugin = new_plugin(api, role="default", use_events=False, poll_interval=0.05)
            plugin.tool(_echo)
            failures: list[PluginError] = []
            plugin.on("error", failures.append)
            async with plugin:
                status, body = await api.post("/api/tools/unregister", {"name": "_echo"})
                assert (status, body["removed"]) == (200, True)
                await api.wait_for(has_echo, timeout=10, what="_echo registered again")
                assert (await api.call("_echo", {"text": "back"}))["output"] == "back"
            assert failures == []
    finally:
        await asyncio.to_thread(tp.stop)
