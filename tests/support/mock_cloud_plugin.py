"""A MOCK of the cloud provider plugins (``gcp``, ``aws``, ``alicloud``) that the real Pulumi engine talks to.

No cloud API and no cloud provider plugin can be reached from these machines. So that the real engine can still
run a cloud profile's program (its ``up``, targeted ``up --replace``, ``destroy``; its state, locks and CLI time),
this module serves the provider plugin's gRPC interface from the calling process and the engine attaches to it
with ``PULUMI_DEBUG_PROVIDERS=<package>:<port>`` (the CLI's documented way to use a provider that already runs),
exactly as :mod:`ale_iac.provider_host` serves the dynamic provider.

What it does, and only that: it accepts every configuration and every input as valid, creates a resource by
returning its inputs plus the computed outputs :mod:`ale_iac.infra.mocks` gives the same types (instance
addresses derived from the name), replaces a resource whose inputs changed, and deletes by forgetting. It never
reaches anything. It keeps a count of what it was asked to do (:attr:`MockCloudPlugin.calls`), and what exists
(:attr:`MockCloudPlugin.live`), so a test can check that a destroy really deleted every resource.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent import futures
from contextlib import contextmanager
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format, struct_pb2
from pulumi.runtime.proto import plugin_pb2, provider_pb2, provider_pb2_grpc

from ale_iac.infra import mocks

PACKAGES = {"gcp": "10.2.0", "aws": "7.51.1", "alicloud": "4.0.0"}
"""The cloud packages ale-iac's programs use, and the SDK versions installed with it (what the CLI asks for)."""


def _to_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(struct, preserving_proto_field_name=True)


def _to_struct(values: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(dict(values))
    return struct


def _type_and_name(urn: str) -> tuple[str, str]:
    """``urn:pulumi:<stack>::<project>::<parent types$>type::<name>`` -> (type, name)."""
    parts = urn.split("::")
    return parts[2].rsplit("$", 1)[-1], parts[3]


class MockCloudPlugin(provider_pb2_grpc.ResourceProviderServicer):  # type: ignore[misc]
    """The gRPC servicer of one package (gcp, aws or alicloud). Thread-safe: the engine calls it concurrently."""

    def __init__(self, package: str) -> None:
        self.package = package
        self.version = PACKAGES[package]
        self.calls: collections.Counter[str] = collections.Counter()
        self.live: dict[str, str] = {}
        """Resource id -> URN, of every resource created and not yet deleted."""
        self._lock = threading.Lock()
        self._serial = 0
        self._addresses = mocks.RecordingMocks()

    def _count(self, method: str) -> None:
        with self._lock:
            self.calls[method] += 1

    # -- plugin and configuration ------------------------------------------------------------------

    def GetPluginInfo(self, request: empty_pb2.Empty, context: grpc.ServicerContext) -> plugin_pb2.PluginInfo:  # noqa: N802
        return plugin_pb2.PluginInfo(version=self.version)

    def Handshake(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.ProviderHandshakeResponse:  # noqa: N802
        return provider_pb2.ProviderHandshakeResponse(accept_secrets=False, accept_resources=True)

    def Attach(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:  # noqa: N802
        return empty_pb2.Empty()

    def GetSchema(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.GetSchemaResponse:  # noqa: N802
        return provider_pb2.GetSchemaResponse(schema="{}")

    def CheckConfig(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.CheckResponse:  # noqa: N802
        return provider_pb2.CheckResponse(inputs=request.news)

    def DiffConfig(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.DiffResponse:  # noqa: N802
        return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE)

    def Configure(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.ConfigureResponse:  # noqa: N802
        # No secrets over the wire (the engine strips them and marks outputs of secret inputs secret again).
        return provider_pb2.ConfigureResponse(acceptSecrets=False, supportsPreview=True, acceptResources=True)

    def Cancel(self, request: empty_pb2.Empty, context: grpc.ServicerContext) -> empty_pb2.Empty:  # noqa: N802
        return empty_pb2.Empty()

    # -- resources -----------------------------------------------------------------------------------

    def Check(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.CheckResponse:  # noqa: N802
        self._count("check")
        return provider_pb2.CheckResponse(inputs=request.news)

    def Diff(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.DiffResponse:  # noqa: N802
        self._count("diff")
        olds = {k: v for k, v in _to_dict(request.olds).items() if k != "__defaults"}
        news = {k: v for k, v in _to_dict(request.news).items() if k != "__defaults"}
        changed = sorted(key for key in set(olds) | set(news) if olds.get(key) != news.get(key))
        if not changed:
            return provider_pb2.DiffResponse(changes=provider_pb2.DiffResponse.DIFF_NONE)
        # A cloud resource whose inputs change is replaced (the simplest honest answer for a mock).
        return provider_pb2.DiffResponse(
            changes=provider_pb2.DiffResponse.DIFF_SOME, replaces=changed, diffs=changed, deleteBeforeReplace=True
        )

    def Create(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.CreateResponse:  # noqa: N802
        typ, name = _type_and_name(request.urn)
        outputs = _to_dict(request.properties)
        if request.preview:
            return provider_pb2.CreateResponse(id="", properties=_to_struct(outputs))
        mocks.add_computed(self._addresses, typ, name, outputs)  # the outputs the recording mocks give
        with self._lock:
            self._serial += 1
            resource_id = f"{name}-{self._serial}"
            self.live[resource_id] = request.urn
            self.calls["create"] += 1
        return provider_pb2.CreateResponse(id=resource_id, properties=_to_struct(outputs))

    def Read(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.ReadResponse:  # noqa: N802
        self._count("read")
        with self._lock:
            exists = request.id in self.live
        if not exists:
            return provider_pb2.ReadResponse()  # gone: the engine drops it from the state
        return provider_pb2.ReadResponse(id=request.id, properties=request.properties, inputs=request.inputs)

    def Update(self, request: Any, context: grpc.ServicerContext) -> provider_pb2.UpdateResponse:  # noqa: N802
        self._count("update")
        return provider_pb2.UpdateResponse(properties=request.news)

    def Delete(self, request: Any, context: grpc.ServicerContext) -> empty_pb2.Empty:  # noqa: N802
        with self._lock:
            self.live.pop(request.id, None)
            self.calls["delete"] += 1
        return empty_pb2.Empty()


@contextmanager
def serving(packages: tuple[str, ...] = tuple(PACKAGES)) -> Iterator[dict[str, MockCloudPlugin]]:
    """Serve a mock plugin per package on 127.0.0.1 and point the engine's CLI calls at them: sets
    ``PULUMI_DEBUG_PROVIDERS`` in ``os.environ`` (which :class:`ale_iac.engine.Engine` passes on, with its own
    dynamic provider added) for the length of the block."""
    servers: list[grpc.Server] = []
    plugins: dict[str, MockCloudPlugin] = {}
    attach: list[str] = []
    for package in packages:
        plugin = MockCloudPlugin(package)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"mock-{package}"))
        provider_pb2_grpc.add_ResourceProviderServicer_to_server(plugin, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        plugins[package] = plugin
        attach.append(f"{package}:{port}")
    before = os.environ.get("PULUMI_DEBUG_PROVIDERS")
    os.environ["PULUMI_DEBUG_PROVIDERS"] = ",".join(filter(None, [before, *attach]))
    try:
        yield plugins
    finally:
        if before is None:
            os.environ.pop("PULUMI_DEBUG_PROVIDERS", None)
        else:
            os.environ["PULUMI_DEBUG_PROVIDERS"] = before
        for server in servers:
            server.stop(grace=None)
