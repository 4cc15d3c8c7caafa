"""Names the dead-code check (vulture, run by scripts/test.sh) must not report: used by a framework
or by name, not by a call it can see. Add a name here only with the reason; delete real dead code.

    .venv/bin/vulture ale_iac agents examples tests bench scripts/vulture_whitelist.py --min-confidence 60
"""
# ruff: noqa
# fmt: off

# pydantic: model configuration, validators and serialized fields
model_config  # unused variable (agents/scripted/deployer.py:68)
_._keep_details  # unused method (agents/claude_code/transcript.py, agents/codex/transcript.py)
num_turns  # read by name (agents/claude_code/transcript.py _RESULT_EXTRAS)
duration_ms  # read by name (agents/claude_code/transcript.py _RESULT_EXTRAS)
_._compiles  # unused method (agents/scripted/deployer.py:84)
model_config  # unused variable (ale_iac/agent_sdk/config.py:17)
model_config  # unused variable (ale_iac/agent_sdk/config.py:38)
model_config  # unused variable (ale_iac/agent_sdk/trajectory.py:24)
model_name  # unused variable (ale_iac/agent_sdk/trajectory.py:57)
total_steps  # unused variable (ale_iac/agent_sdk/trajectory.py:61)
total_errors  # unused variable (ale_iac/agent_sdk/trajectory.py:63)
schema_version  # unused variable (ale_iac/agent_sdk/trajectory.py:67)
_._check_ids  # unused method (ale_iac/agent_sdk/trajectory.py:75)
model_config  # unused variable (ale_iac/cloud_routes.py:62)
_._ranges  # unused method (ale_iac/cloud_routes.py:96)
_._ssh_ranges  # unused method (ale_iac/cloud_routes.py:101)
_._zone  # unused method (ale_iac/cloud_routes.py:120)
_._egress  # unused method (ale_iac/cloud_routes.py: a pydantic validator)
_._guest_agent  # unused method (ale_iac/cloud_routes.py: a pydantic validator)
_._forwarder  # unused method (ale_iac/profile.py: a pydantic validator, StaticRoute.forwarder)
_._network  # unused method (ale_iac/cloud_routes.py:143)
_._image_name  # unused method (ale_iac/cloud_routes.py: GcloudRoute, a validator)
model_config  # unused variable (ale_iac/contract.py:35)
model_config  # unused variable (ale_iac/contract.py:68)
model_config  # unused variable (ale_iac/contract.py:96)
gpu_count  # unused variable (ale_iac/infra/shapes.py:47)
model_config  # unused variable (ale_iac/profile.py:32)
_._check_endpoints  # unused method (ale_iac/profile.py:68)
model_config  # unused variable (ale_iac/runner/experiment.py:34)
_._one_target  # unused method (ale_iac/runner/experiment.py:47)
model_config  # unused variable (ale_iac/runner/tasks.py:37)

# loaded by name (presets, registries, test presets) or called by a framework (typer, grpc, http.server, pulumi mocks, pytest)
ScriptedDeployer  # unused class (agents/scripted/deployer.py:132)
ls  # unused function (ale_iac/cli/images.py:40)
ls  # unused function (ale_iac/cli/sandbox.py:78)
_.new_resource  # unused method (ale_iac/infra/mocks.py:96)
project_program  # unused function (ale_iac/infra/program.py:30)
_.__path__  # unused attribute (ale_iac/langhost.py:159)
_.intercept_service  # unused method (ale_iac/langhost.py:600)
pytestmark  # unused variable (tests/agents/test_scripted.py:47)
clean_task_dirs  # unused function (tests/agents/test_scripted.py:170)
pytestmark  # unused variable (tests/bridges/test_cua_bridge.py:25)
pytestmark  # unused variable (tests/bridges/test_vm_bridge.py:34)
pytest_plugins  # unused variable (tests/conftest.py:27)
pytest_collection_modifyitems  # unused function (tests/conftest.py:30)
pytest_runtest_setup  # unused function (tests/conftest.py:38)
_isolated_home  # unused function (tests/conftest.py:50)
pytestmark  # unused variable (tests/infra/test_cloud_policy_cli.py:20)
pytestmark  # unused variable (tests/runner/test_evaluate.py:25)
pytestmark  # unused variable (tests/runner/test_gc.py:15)
pytestmark  # unused variable (tests/runner/test_pool.py:17)
pytestmark  # unused variable (tests/sandbox/test_client.py:30)
anyio_backend  # unused function (tests/sandbox/test_client.py:33)
protocol_version  # unused variable (tests/substrates/test_authproxy.py:27)
_.close_connection  # unused attribute (tests/substrates/test_authproxy.py:49)
_.do_GET  # unused method (tests/substrates/test_authproxy.py:58)
_.do_POST  # unused method (tests/substrates/test_authproxy.py:61)
_.log_message  # unused method (tests/substrates/test_authproxy.py:64)
fresh_records  # unused function (tests/substrates/test_authproxy.py:102)
_stop_what_is_left  # unused function (tests/runner/test_gc_crashes.py:50)
pytestmark  # unused variable (tests/substrates/test_isolation.py:41)
CrashAgent  # unused class (tests/support/agents.py:30)
SleepyAgent  # unused class (tests/support/agents.py:38)
SecretAgent  # unused class (tests/support/agents.py:46)
WriterAgent  # unused class (tests/support/agents.py:64)

# held on purpose: the supervisor keeps slirp4netns's exit pipe open for its whole life
_.slirp_exit_w  # unused attribute (ale_iac/substrates/local/supervisor.py:137)
_.slirp_exit_w  # unused attribute (ale_iac/substrates/local/supervisor.py:429)

# the parameters of __aexit__
exc_type  # unused variable (ale_iac/sandbox/connection.py:73)
tb  # unused variable (ale_iac/sandbox/connection.py:73)


# ale-iac report: read by its jinja2 templates (ale_iac/report/templates/), which vulture cannot see
reasoning  # unused variable (ale_iac/report/atif.py)
_.has_error  # unused property (ale_iac/report/atif.py)
agent_version  # unused variable (ale_iac/report/atif.py)
truncated  # unused variable (ale_iac/report/model.py)
_.wall_s  # unused property (ale_iac/report/model.py)
href  # unused variable (ale_iac/report/render.py)
egress_attempts  # unused variable (ale_iac/report/model.py)
# called by a framework: html.parser (tests/report/test_render.py), selenium's options (tests/support/browser.py)
_.handle_starttag  # unused method (tests/report/test_render.py)
_.binary_location  # unused attribute (tests/support/browser.py)

# pydantic validators and fields (called and set by pydantic; set through TrajectoryBuilder.build(**metrics))
_._http_url  # unused method (ale_iac/agent_sdk/config.py)
_._model_name  # unused method (ale_iac/agent_sdk/config.py)
total_cost_usd  # unused variable (ale_iac/agent_sdk/trajectory.py)
# test deployers, loaded by the name their preset.yaml gives (tests/executors/presets/)
ProbeDeployer  # unused class (tests/executors/presets/probe/deployer.py)
DockerProbe  # unused class (tests/executors/presets/docker_probe/deployer.py)
# read by the SDK (auto.Stack.__repr__) on a stack made without its __init__ (ale_iac/engine.py)
_._mode  # unused attribute (ale_iac/engine.py)
# substrates, loaded by the name ale_iac/substrates/registry.py gives
LocalSubstrate  # unused class (ale_iac/substrates/local/substrate.py)
DockerSubstrate  # unused class (ale_iac/substrates/docker/substrate.py)
QemuSubstrate  # unused class (ale_iac/substrates/qemu/substrate.py)
# a Pulumi output of docker units (in the stack's state; plain pulumi shows it)
image_tag  # unused variable (ale_iac/substrates/docker/substrate.py)
# read from the state and outputs of local units made before the model channel went through the endpoint
host_socket  # unused variable (ale_iac/contract.py)
gateway_socket  # unused variable (ale_iac/substrates/local/runtime.py, substrate.py)
pytest_generate_tests  # unused function (tests/substrates/test_isolation.py: a pytest hook)
do_PUT  # http.server calls it by the method name (tests/substrates/qemu/test_metadata.py)
_._one_way_out  # unused method (ale_iac/profile.py: a pydantic validator)
# the egress proxy's plugin, loaded by proxy.py by its name, and its hooks (ale_iac/substrates/egress_proxy.py)
EgressPlugin  # unused class
BoundedProxy  # unused class (proxy.py's proxy plugin in its place, loaded by its name)
_.before_upstream_connection  # unused method
_.resolve_dns  # unused method
_.on_access_log  # unused method
