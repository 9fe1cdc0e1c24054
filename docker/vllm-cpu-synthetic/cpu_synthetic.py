"""vLLM 0.27.1's synthetic rejection sampling for its CPU build (installed into the image as
sparklab_cpu_synthetic.py by docker/vllm-cpu-synthetic/build.sh).

vLLM 0.27.1 accepts `speculative_config.rejection_sample_method: synthetic` with `synthetic_acceptance_rates` (per
position, unconditional) or `synthetic_acceptance_length` (vllm/config/speculative.py:217-237, resolved at
:239-281 and :1302-1317); the rejection sampler turns the rates into conditional ones (c_i = p_i / p_{i-1},
vllm/v1/spec_decode/utils.py:598-601; vllm/v1/sample/rejection_sampler.py:77-90) and its Triton kernels accept
position i's draft when a uniform draw is below c_i (greedy kernel rejection_sampler.py:745-756, random kernel
:805-827). The CPU build replaces both kernels with C++ ones that assert synthetic mode away
(vllm/utils/cpu_triton_utils.py:348, :387: "Synthetic acceptance not supported with CPU sampling"). These two
functions are the Triton kernels' loops in plain Python over the same tensors, called in place of those asserts
when SPARKLAB_VLLM_CPU_SYNTHETIC=1; everything else (the target's forward over K+1 tokens, the drafter, the
scheduler, the counters) is the engine's own.
"""

from __future__ import annotations

import os

SWITCH = "SPARKLAB_VLLM_CPU_SYNTHETIC"
EXPAND_SWITCH = "SPARKLAB_VLLM_CPU_EXPAND_FIX"


def enabled() -> bool:
    return os.environ.get(SWITCH) == "1"


def expand_fix_enabled() -> bool:
    return os.environ.get(EXPAND_SWITCH) == "1"


def expand(output, input_val, cu_num_tokens, replace_from, replace_to) -> None:
    """expand_kernel (vllm/v1/sample/rejection_sampler.py:848-870): request r's value, with replace_from turned into
    replace_to, written to each of its tokens' places in `output`, whatever the dtype.

    The CPU build's stand-in for it (vllm/utils/cpu_triton_utils.py:408-422, installed by
    vllm/v1/worker/cpu_model_runner.py:115; the same in 0.32.0 at :390-404, installed by vllm/platforms/cpu.py:711-713)
    hands the C++ kernel `output.to(torch.int64)`: for the float32 temperature and top_p that
    apply_sampling_constraints expands (rejection_sampler.py:537-561) that is a copy, never written back, so every
    drafted position is sampled with whatever `new_empty` held (read: temperature -3.8e-25, 949183.0, 0.0; top_p
    0.0, 6.1e-38) and the answers at temperature > 0 are not the target's. Temperature 0 never expands (all greedy
    returns first), which is why equality at temperature 0 holds."""
    import torch

    source = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    ends = cu_num_tokens.to(torch.int64)
    if ends.numel() == 0:
        return
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    output[: int(ends[-1])] = torch.repeat_interleave(source, counts).to(output.dtype)


def greedy(output_token_ids, cu_num_draft_tokens, draft_token_ids, target_argmax, bonus_token_ids, is_greedy,
           uniform_probs, synthetic_conditional_rates) -> None:
    """rejection_greedy_sample_kernel with SYNTHETIC_MODE (rejection_sampler.py:712-771): per request, position i's
    draft is kept when u_i < c_i (and it is not padding, -1), else the target's argmax is written and the request
    stops; a request whose drafts were all kept gets the bonus token."""
    ends = cu_num_draft_tokens.tolist()
    drafts, argmax = draft_token_ids.tolist(), target_argmax.tolist()
    uniform, rates = uniform_probs.tolist(), synthetic_conditional_rates.tolist()
    bonus = bonus_token_ids.reshape(-1).tolist()
    rows = None if is_greedy is None else is_greedy.tolist()
    start = 0
    for req, end in enumerate(ends):
        if rows is None or rows[req]:
            rejected = False
            for pos in range(end - start):
                i = start + pos
                accepted = uniform[i] < rates[pos] and drafts[i] >= 0
                output_token_ids[req, pos] = drafts[i] if accepted else argmax[i]
                if not accepted:
                    rejected = True
                    break
            if not rejected:
                output_token_ids[req, end - start] = bonus[req]
        start = end


def random(output_token_ids, cu_num_draft_tokens, draft_token_ids, bonus_token_ids, recovered_token_ids,
           uniform_probs, is_greedy, synthetic_conditional_rates) -> None:
    """rejection_random_sample_kernel with SYNTHETIC_MODE (rejection_sampler.py:774-835): the same loop for the
    sampled (non-greedy) requests, a rejected position taking the recovered token."""
    ends = cu_num_draft_tokens.tolist()
    drafts, recovered = draft_token_ids.tolist(), recovered_token_ids.tolist()
    uniform, rates = uniform_probs.tolist(), synthetic_conditional_rates.tolist()
    bonus = bonus_token_ids.reshape(-1).tolist()
    rows = is_greedy.tolist()
    start = 0
    for req, end in enumerate(ends):
        if not rows[req]:
            rejected = False
            for pos in range(end - start):
                i = start + pos
                accepted = drafts[i] >= 0 and uniform[i] < rates[pos]
                output_token_ids[req, pos] = drafts[i] if accepted else recovered[i]
                if not accepted:
                    rejected = True
                    break
            if not rejected:
                output_token_ids[req, end - start] = bonus[req]
        start = end
