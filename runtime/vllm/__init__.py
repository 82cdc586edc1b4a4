"""vLLM serving arguments derived from the policy: paged KV-cache sizing, drain, KV preservation.

``serve_args(policy, workload, model)`` is the one source of the flex container's arguments;
``plan_kv_cache`` returns every number behind them with its explanation.
"""

from runtime.vllm.backends import BackendError, BlockRule, block_rule
from runtime.vllm.kv_cache_plan import KvCachePlan, KvPlanError
from runtime.vllm.model_spec import MlaDims, ModelConfigError, ModelSpec, load_model_spec
from runtime.vllm.plan import plan_kv_cache, render_args, serve_args

__all__ = [
    "BackendError",
    "BlockRule",
    "KvCachePlan",
    "KvPlanError",
    "MlaDims",
    "ModelConfigError",
    "ModelSpec",
    "block_rule",
    "load_model_spec",
    "plan_kv_cache",
    "render_args",
    "serve_args",
]
