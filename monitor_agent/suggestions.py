"""What to try next for each finding, from the field's troubleshooting experience.

Most likely fix first. Detectors pick the variant that fits the evidence (a NaN at the
very start points at the data, a NaN after a climbing gradient norm at the learning rate).

Example::

    Finding(..., suggestions=NAN_AFTER_GROWTH)
"""

from __future__ import annotations

NAN_AT_START = (
    "Inspect the input data: a NaN/inf in the first steps usually comes from the batch "
    "(bad values, division by zero in preprocessing, empty sequences).",
    "Check the initialisation and any log/sqrt/division in the loss for zero or negative inputs.",
    "Run a few steps with torch.autograd.set_detect_anomaly(True) to find the first bad op.",
)
NAN_AFTER_GROWTH = (
    "The gradient norm climbed before the NaN: lower the learning rate (2-10x) or lengthen warmup.",
    "Enable or tighten gradient clipping (clip_grad_norm_ 1.0).",
    "Restart from the last good checkpoint rather than continuing.",
)
NAN_SUDDEN = (
    "A NaN with no warning sign usually means one bad batch: inspect the batch of this step "
    "and skip or filter non-finite inputs.",
    "Guard the loss with torch.isfinite before backward() and skip the step.",
    "Run with torch.autograd.set_detect_anomaly(True) to find the op that produced it.",
)
NAN_FP16 = (
    "fp16 overflow: switch autocast to bfloat16 (same range as float32).",
    "Lower the learning rate; check the GradScaler is stepping and updating.",
)
LOSS_SPIKE = (
    "Inspect the batch of this step (corrupted, mislabelled or out-of-distribution data).",
    "If spikes recur, lower the learning rate or enable gradient clipping.",
    "For large models: skip batches whose loss is far above the EMA, or lower Adam beta2.",
)
DIVERGENCE = (
    "Lower the learning rate 5-10x (or lengthen warmup), then restart from the last good checkpoint.",
    "Enable gradient clipping (clip_grad_norm_ 1.0) if it is off.",
    "Check for a learning-rate schedule bug (a jump in lr at the start of the rise).",
)
GRAD_EXPLOSION = (
    "Lower the learning rate; the gradient norm has stayed far above its history for "
    "several steps (check the evidence's lr for a jump).",
    "Enable or tighten gradient clipping.",
    "Check the layers named in the evidence for missing normalisation or a bad init.",
)
GRAD_EXPLOSION_CLIPPED = (
    "Lower the learning rate; the gradient norm has stayed far above its history for "
    "several steps (check the evidence's lr for a jump).",
    "Clipping is on, so each update is bounded, but the optimizer keeps being pushed off "
    "course: clipping hides the cause, it does not fix it.",
    "Check the layers named in the evidence for missing normalisation or a bad init.",
)
GRAD_VANISHING = (
    "Early layers get < 1% of the late layers' gradient: add residual connections or "
    "normalisation (LayerNorm/BatchNorm).",
    "Use a non-saturating activation (ReLU/GELU instead of sigmoid/tanh) and a fan-in "
    "aware init (Kaiming/Xavier).",
    "Check the gradient actually reaches the early layers (detach(), no_grad, frozen params).",
)
GRAD_DOMINANCE = (
    "One parameter dominates the gradient: check its initialisation (e.g. a randn-initialised "
    "scale instead of ones) and its learning rate.",
    "Clipping the global norm then starves every other parameter: clip per parameter group "
    "or fix the dominant parameter's scale.",
)
DEAD_LAYER = (
    "Check the parameter is in the optimizer and its param group's lr is not 0.",
    "Check it is connected to the loss (no detach(), not left out of forward, requires_grad).",
    "For ReLU layers with all-zero gradients: dead units, lower the lr or use LeakyReLU/GELU.",
)
UPDATE_RATIO_HIGH = (
    "update/param above 0.1: reduce the learning rate 5-10x.",
    "Lengthen warmup; check the schedule did not jump.",
)
UPDATE_RATIO_LOW = (
    "update/param below 1e-7: the run is not learning; raise the learning rate (10-100x).",
    "Check the scheduler is not stuck at 0 and the optimizer holds the parameters.",
)
GAIN_DRIFT = (
    "The gradient's amplification through depth is creeping up: watch for explosion; "
    "consider lower lr, gradient clipping or stronger normalisation.",
    "Check residual branch scaling (e.g. 1/sqrt(2*n_layers) init of output projections).",
)
CLIP_SATURATION = (
    "Clipping on most steps means the learning rate is likely too high: lower it.",
    "If the gradient norm grows naturally during training, raise the clip threshold; "
    "constant clipping turns the optimizer into sign-SGD.",
)
PLATEAU = (
    "The loss is flat: raise the learning rate if it is tiny, or check the schedule.",
    "Check the data pipeline (same batch repeated, labels shuffled) and that gradients flow.",
    "If it improved before, the model may be at capacity: a bigger model or more data.",
)
PLATEAU_LR_RAISED = (
    "The learning rate was raised within this window and the loss still did not move: check "
    "that the optimizer steps the parameters (frozen or detached parameters, the LR set on "
    "the wrong param group, a scheduler overriding it).",
    "Check the data pipeline (same batch repeated, labels shuffled) and that gradients flow.",
)
OVERFITTING = (
    "Stop early: keep the checkpoint at the best validation loss.",
    "Add regularisation: weight decay, dropout, data augmentation; or get more data.",
    "Reduce model size or the number of epochs.",
)
CATEGORY_DIVERGENCE = (
    "Look at this category's data: a new or shifted source, a tokenisation or labelling bug, "
    "or a mixture weight that changed.",
    "Check the data mixture: the category may be under-sampled now, or drowned by another "
    "that grew.",
    "If it is forgetting (learned early, lost later), raise its sampling weight or replay it.",
)
DEAD_UNITS = (
    "Lower the learning rate or lengthen warmup: a large update pushed the pre-activations "
    "below zero for every input, and dead ReLUs get no gradient to come back.",
    "Check the biases and the input scale of the layer before it (a large negative shift "
    "kills units); re-initialise or normalise (LayerNorm/BatchNorm) before the activation.",
    "Use LeakyReLU, GELU or SiLU, which keep a gradient below zero.",
)
ACTIVATION_BLOWUP = (
    "Lower the learning rate (2-10x) or enable gradient clipping: activations growing by "
    "orders of magnitude precede attention-logit and loss divergence.",
    "Add or check normalisation (pre-LayerNorm, QK-norm, logit soft-capping) and weight decay "
    "on the layers feeding this module.",
    "Check the initialisation scale of the layers feeding it, and restart from the last good "
    "checkpoint if values already reached inf/NaN.",
)
THROUGHPUT_DATA = (
    "data_time rose: the data loader is starving the model; add workers, prefetch or pin memory.",
    "Check the storage / network the data comes from.",
)
THROUGHPUT_COMPUTE = (
    "Step time rose without data waits: check for other jobs on the device, thermal "
    "throttling, or a memory leak forcing allocator work.",
    "Profile a few steps (torch.profiler) and compare with the baseline.",
)
MEMORY_HIGH = (
    "Memory is near the device total: reduce batch size, enable activation checkpointing, "
    "or use mixed precision.",
    "Call optimizer.zero_grad(set_to_none=True) and free references to old tensors.",
)
MEMORY_LEAK = (
    "Memory grows every step: look for tensors kept across steps (losses appended without "
    ".item() or .detach(), retain_graph=True, growing caches).",
    "Compare torch.cuda.memory_summary() (or tracemalloc) at two steps to find what grows.",
)
LOSS_SCALE = (
    "The fp16 loss scale is collapsing: switch to bfloat16 autocast (no loss scaling needed).",
    "Lower the learning rate; persistent overflow often means the model is diverging.",
    "Check for ops that overflow in fp16 (large logits, exp, unscaled attention).",
)
STRAGGLER = (
    "One rank computes much slower than the others: check that host (thermal throttling, "
    "other processes, a failing GPU, NUMA/CPU binding).",
    "Check its data loader and storage; uneven shards make one rank slower.",
)
STALLED = (
    "The job stopped reporting: check it is alive (hung collective, deadlocked data loader, "
    "preemption); py-spy dump the process.",
    "For NCCL hangs set NCCL_ASYNC_ERROR_HANDLING / a collective timeout so it fails fast.",
)
GRAD_DIST_COLLAPSED = (
    "Most gradient entries of this parameter became one value (usually 0): look for dead "
    "units (ReLU after a large update: lower the lr, or use GELU/LeakyReLU) or saturated "
    "activations (tanh/sigmoid, softmax with huge logits).",
    "Check the parameter is still used in the forward pass (masking, a detached branch).",
)
GRAD_DIST_HEAVY_TAIL = (
    "A few gradient entries grew far beyond the bulk: look for outlier tokens or features "
    "(rare embeddings, attention logits growing); clipping hides them, it does not fix them.",
    "Lower the lr or raise warmup; consider QK-norm / logit soft-capping for attention.",
)
GRAD_DIST_SHIFTED = (
    "The gradient of this parameter is consistently one-signed: the parameter is being "
    "pushed in one direction (a bias compensating for a data or normalisation shift).",
    "Check input normalisation and the label distribution of recent batches.",
)
EFFECTIVE_LR_AMPLIFIED = (
    "The optimizer now takes far larger steps per unit of gradient than it did: with Adam-"
    "family optimizers, check eps (too small lets a near-zero second moment blow a step up) "
    "and whether the optimizer state was reset or reloaded wrongly on a resume.",
    "Check every param group's lr and the scheduler: the reported lr is the first group's.",
    "Lower the learning rate or enable gradient clipping until the ratio is back in its band.",
)
EFFECTIVE_LR_DAMPED = (
    "The optimizer now takes far smaller steps per unit of gradient than it did: check for a "
    "second moment inflated by a few huge gradients (Adam's v decays over 1/(1-beta2) steps).",
    "Check weight decay, gradient accumulation scaling and any per-group lr the scheduler sets.",
    "If it is deliberate (a schedule the reported lr does not show), silence this warning.",
)
