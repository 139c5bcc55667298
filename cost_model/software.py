"""What the training program does that the plan does not say: its attention kernel, and which
communication it overlaps with compute.

The same plan runs at different speeds under different programs: Megatron-LM in 2021 had no fused
attention and reduced gradients after the backward; Megatron-Core in 2024 runs FlashAttention and
overlaps every collective it can. ``Software`` names those differences so that one set of hardware
constants serves every program, and ``DEFAULT`` is meshplan's own runtime. Each preset lists its
sources; none is fitted to a measurement.

Fields:

* ``attention``: ``"flash"`` (fused kernel: scores never reach memory; Dao et al. 2022) or
  ``"plain"`` (two batched matmuls with the b*a*s^2 scores written, a fused scale-mask-softmax and an
  attention dropout in between, as Megatron-LM's ``CoreAttention`` before FlashAttention; costed in
  ``kernels.plain_attention_fwd_bwd_s``).
* ``attention_speed``: the program's fused-attention kernel's rate over FlashAttention-2's on the same
  GPU (the accelerator's ``attention_efficiency`` is FA2's). FlashAttention-1-era kernels, the CUDA one
  and Tri Dao's Triton one, run at 0.44 of it, forward + backward, causal, head dim 128, on A100 and on
  H100 alike: Dao 2023, FlashAttention-2 (arXiv:2307.08691) Fig. 4 (A100: Triton 68 against FA2 155
  TFLOPs/s at 2k, 78 against 182 at 8k) and Fig. 7 (H100: FA1 108 against 265 at 2k, 135 against 308 at
  8k); sec. 4: FA2 is "1.3-2.5x faster than FlashAttention in Triton".
* ``attention_kernel``: which fused kernel runs the attention: ``"fa2"`` (FlashAttention-2, PyTorch SDPA's
  flash backend: the accelerator's ``attention_by_seq_len`` / ``attention_efficiency``) or ``"cudnn"``
  (cuDNN's fused attention, which Transformer Engine's ``DotProductAttention`` selects as its
  ``FusedAttention`` backend on Hopper and Blackwell: the accelerator's ``cudnn_attention_by_seq_len``,
  NVIDIA's own training benchmark of it, where the preset has one; else the default kernel's rate).
* ``dropout``: hidden and attention dropout on (Megatron's GPT default, 0.1): masks are written and
  kept (Korthikanti et al. 2022 sec. 4 counts them in the activation memory). It is the default of
  Megatron's ``TransformerConfig`` (``hidden_dropout`` and ``attention_dropout`` 0.1), which its GPT
  models keep; Llama-style models set both to 0 (Megatron-Bridge ``LlamaBridge``: ``hidden_dropout=0.0``,
  and Hugging Face's ``attention_dropout`` 0.0 in every Llama 2/3 config), so ``drops_out`` applies
  it to the GPT family only.
* ``overlap_grad_reduce``: gradients are reduced in buckets while the backward runs (PyTorch DDP, Li
  et al. 2020; Megatron-Core ``--overlap-grad-reduce``), else after the last backward.
* ``overlap_param_gather``: ZeRO-1's all-gather of the updated parameters runs under the next
  forward (Megatron-Core ``--overlap-param-gather``), else after the optimizer step.
* ``sp_regather``: under sequence parallelism the column-parallel GEMMs keep their sequence-sharded
  input and all-gather it again in the backward (Megatron-LM and Megatron-Core: the activation
  memory Korthikanti et al. 2022 sec. 4.2.2 counts), else the gathered input is kept (DTensor's
  ``SequenceParallel``: autograd saves the redistributed tensor).
* ``tp_comm_overlap``: tensor-parallel all-gathers and reduce-scatters run under the GEMMs that
  consume or produce them (Megatron-Core ``--tp-comm-overlap``, Transformer Engine userbuffers;
  needs sequence parallelism), else each waits. Not under NVFP4 (``overlaps_tp_comm``): NVIDIA's recipes turn
  it off for every NVFP4 run (Megatron-Bridge scripts/performance/configs/llama/llama3_llm_pretrain.py and
  llama31_llm_pretrain.py, v0.3.0 to v0.5.0: ``cfg.comm_overlap.tp_comm_overlap = False if precision ==
  "nvfp4"``).
* ``fp32_grad_reduce``: gradients are accumulated and reduced in fp32 (4 bytes per parameter on the
  wire) whatever the training dtype: Megatron-LM forces it for bf16 ("bfloat16 requires gradient
  accumulation and all-reduce to be done in fp32", ``megatron/training/arguments.py``).
* ``zero1_allreduce``: ZeRO-1 reduces the gradients with DDP's all-reduce and then broadcasts each
  rank's updated shard (PyTorch ``ZeroRedundancyOptimizer``, meshplan's runtime: 3 Psi), instead of
  a reduce-scatter and an all-gather (Megatron's distributed optimizer: 2 Psi).
* ``zero3_prefetch_params``: parameters a ZeRO-3 implementation gathers ahead of the layer that
  computes; ``None`` is a whole layer (FSDP2 prefetches the next layer). DeepSpeed's
  ``stage3_prefetch_bucket_size`` defaults to 5e7 (``deepspeed/runtime/zero/config.py``), far below
  one layer of a 100B-parameter model, so its gathers wait.
* ``zero3_flat``: ZeRO-3's collectives move each GPU's whole volume over its own network link
  instead of aggregating it inside the node first (``collectives.flat_collective_time``).
* ``zero3_regather_recompute``: a layer recomputed in the backward gathers its parameters again.
* ``zero_copy_buffers``: ZeRO-2/3 copy every gathered parameter out of the all-gather buffer and
  every gradient into the reduce-scatter buffer, memory-bound kernels on the GPU (PyTorch FSDP2,
  ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``: ``foreach_all_gather_copy_out``
  runs ``split_with_sizes_copy`` from the flat buffer into each unsharded parameter, and
  ``foreach_reduce`` packs the gradients with ``chunk_cat`` before the reduce-scatter, because each
  parameter is sharded on its own dim 0); else the parameters are views into the flat buffer
  (DeepSpeed ZeRO-3's partitioned parameters).
* ``dtensor_tp_styles``: tensor parallelism is applied with DTensor's parallel styles on each Linear
  (meshplan's runtime, ``codegen/tp_plans.py``) rather than Megatron's fused regions: each
  column-parallel Linear takes its input through its own ``from_local`` and so all-reduces its own
  input gradient, and every op on a DTensor pays DTensor's dispatch (``dispatch.py``).
* ``fsdp_plain_dp``: plain data parallelism beside TP, PP or EP runs as FSDP2 with shard groups of
  one (DDP cannot wrap DTensor parameters or run under ``torch.distributed.pipelining``;
  ``codegen/lower.py``), which gathers each layer's parameters into a second, unsharded copy and
  keeps it from the forward to the end of the backward (``reshard_after_forward=False``).
* ``fsdp_under_pipeline``: FSDP2 modules inside ``torch.distributed.pipelining`` stages accumulate
  unsharded gradients over the micro-batches, keep parameters gathered after the first backward and
  reduce once after the schedule, not overlapped (``PipelineStage.backward_maybe_with_nosync`` and
  ``perform_reduce_grad``); ``data_parallel._pipelined_ops``, ``footprint``.
* ``selective_saves_matmuls``: selective recompute is PyTorch's selective activation checkpointing
  keeping the outputs of the matmuls and of the TP collectives and recomputing the rest of the block
  (``codegen.program.SELECTIVE_SAVE_OPS``), not Korthikanti's attention core alone
  (``memory.matmul_save_units``).
* ``selective_alternate_matmuls`` (with ``selective_saves_matmuls``): torchtitan's op-level policy, which keeps
  the attention kernel's output too and recomputes every second matmul of the block in forward order ("Saves
  output of all compute ops, except every second mm": ``_custom_policy`` in
  torchtitan/parallelisms/parallelize_llama.py @0413364 and @9dec370, the commits of its published A100 and H100
  runs; ``SelectiveAC`` in torchtitan/distributed/activation_checkpoint.py today, the same rule over aten.mm
  and aten.linear, the MoE router's gate always recomputed). In a Llama block (wq, wk, wv, wo, w1, w3, w2) that
  is wk, wo and w3: the backward repeats them and the memory-bound ops but not the attention core, and the
  block keeps wq, wv, w1 and w2's outputs and the attention output (``memory.matmul_save_units``). Dense
  blocks only: a MoE block keeps ``selective_saves_matmuls``'s rule.
* ``ddp_accumulation_copy``: with PyTorch DDP and more than one micro-batch, the gradients of the
  micro-batches run under ``no_sync()`` accumulate in ``param.grad`` outside DDP's all-reduce buckets,
  so the buckets are a second copy of them (with one micro-batch, ``gradient_as_bucket_view=True``
  makes the gradients views into the buckets: one copy).
* ``eager_modules``: the model's own PyTorch modules run eagerly, under ``torch.autocast`` for a
  16-bit dtype (meshplan's runtime, ``codegen/precision.py``): activations as autograd saves them
  there (``memory.eager_layer_bytes``: nn.RMSNorm's fp32 tensors, autocast's casts of fp32 inputs and
  weights under DDP or TP alone), not Korthikanti's count of Megatron's fused modules. PyTorch DDP's
  broadcast of the parameters at wrap time (``_sync_module_states``) is not counted: its buffer, at
  most the parameters' bytes, is gone before the first optimizer step makes the AdamW state (twice
  the parameters' bytes), so it is never the peak (a profile of the CPU runtime: the 21 MB block seen
  at the second step is DDP rebuilding its gradient buckets, with the old ones freed).
* ``search_space``: what a search costed as this program offers (``meshplan plan --software``):
  ``"meshplan"``, the options of meshplan's runtime (FSDP-style ZeRO-1/2/3, HSDP, every schedule);
  ``"megatron"``, Megatron-Core's (``solver.space.MEGATRON``: the distributed optimizer, Megatron-FSDP
  as ZeRO-3, 1F1B and interleaved schedules).
* ``grad_accumulation_add``: every micro-batch after the first adds its weight gradients to those
  accumulated so far, a memory-bound pass over them (autograd's ``AccumulateGrad``; FSDP2 adds the
  reduce-scattered shard, or under torch pipelining the unsharded gradients); Megatron's gradient
  accumulation fusion writes them from the weight-gradient GEMM instead, at no extra pass.
* ``fp32_params``: under bf16 the parameters stay fp32 and are themselves the master weights, and
  their gradients are fp32 (4, 4, 8 bytes per parameter for params, grads, AdamW state): bf16 exists
  only as FSDP2's gathered copy (``MixedPrecisionPolicy(param_dtype=bf16)``: "the sharded parameters
  stay in their original dtype", the all-gather runs in bf16) and autocast's per-op casts (meshplan's
  runtime, ``codegen/precision.py``); else Megatron's (2, 2, 12): bf16 parameters and gradients
  beside fp32 master weights in the optimizer (``memory.STATE_BYTES``). FSDP2 casts each unsharded
  bf16 gradient to the fp32 ``reduce_dtype`` before its reduce-scatter (``foreach_reduce``), so a
  unit's gradients are held in both dtypes at once.
* ``master_weights``: a 16-bit model's optimizer keeps fp32 master weights and fp32 Adam moments beside the 16-bit
  parameters (12 bytes a parameter, ``memory.STATE_BYTES``: Megatron's distributed optimizer, FSDP1's DEFAULT
  mixed precision). Off: the parameters are stored in the 16-bit dtype and are what the optimizer updates, and
  ``torch.optim.Adam`` keeps its moments in the parameters' dtype (``exp_avg = torch.zeros_like(p)``): 4 bytes a
  parameter for both under bf16 (NeMo Automodel's models end ``initialize_weights`` with ``self.to(bf16)``).
  FSDP2 then keeps its sharded gradients in that dtype too, whatever its ``reduce_dtype``: it casts the
  reduce-scattered fp32 shard back to the parameter's dtype, so ``fp32_grad_reduce`` there costs only the
  transient fp32 copy of a unit's gradients (not Megatron's fp32 ``main_grad`` buffers).
* ``vocab_parallel_loss``: under TP the cross-entropy runs on the vocabulary shards (Megatron's
  ``vocab_parallel_cross_entropy``; meshplan's runtime: the output head keeps its logits ``Shard(-1)``
  and ``runtime.loss`` runs torch's ``loss_parallel``), holding V/tp logits per token and exchanging
  one value per token three times (max, sum of exponentials, target logit); else the output layer
  gathers whole logits to every TP rank and each computes the full loss, holding V.
* ``offload_overlap``: activations offloaded to host memory (``Recompute.OFFLOAD``) are copied on streams of
  their own while the layers compute: Megatron-Core's ``--cpu-offloading`` runs Transformer Engine's
  ``AsyncDoubleBufferGroupOffloadHandler`` (transformer_engine/pytorch/cpu_offload.py: "D2h and h2d copying
  are completely hidden behind computation if computation time of a layer is longer than host-device
  communication time"), so a layer's copy costs only what exceeds its compute. Else the copies run in
  order on the compute stream and cost their whole time: meshplan's runtime offloads with PyTorch's
  ``torch.autograd.graph.save_on_cpu``, whose pack is a blocking ``copy_`` into pinned memory.
* ``fp8_param_gather``: under FP8 the weights are kept as FP8 tensors, not 16-bit ones with an FP8 copy
  (Megatron-Core ``--fp8-param-gather``: "Keep the compute param in fp8 (do not use any other intermediate
  dtype) and perform the param all-gather in fp8", megatron/training/arguments.py; Transformer Engine's
  ``fp8_model_init``): 1 byte a parameter at rest and on the wire of ZeRO's parameter all-gather, and the
  FP8 copy TE would cache for the step is the parameter itself, plus the one transposed (Hopper) or
  columnwise (MXFP8) copy the backward needs, 1 byte more. The fp32 master weights stay in the optimizer.
  Megatron takes it with its distributed optimizer only (ZeRO-1 here: arguments.py asserts the distributed
  optimizer or an FSDP, and turns it off under torch FSDP2 with TE >= 2.0, which ``meshplan export`` maps
  ZeRO-3 to), so it applies to ZeRO-1 plans. NVIDIA's perf recipes set it for every FP8 recipe:
  Megatron-Bridge ``bf16_with_fp8_current_scaling_mixed``, ``bf16_with_fp8_delayed_scaling_mixed`` and
  ``bf16_with_mxfp8_mixed`` (src/megatron/bridge/training/mixed_precision.py @067f987df0:
  ``cfg.fp8_param_gather = True``), which ``_perf_precision`` returns; ``meshplan export --to megatron``
  passes ``--fp8-param-gather`` with an FP8 ZeRO-1 plan, so both Megatron-Core presets carry it. Under NVFP4
  (float4) it stands for Megatron's ``--fp4-param-gather`` (NVFP4 weights, 0.5 + 1/16 bytes a parameter,
  ``memory.GEMM_OPERAND_BYTES``), which Megatron-Bridge's ``bf16_with_nvfp4_mixed`` sets
  (``cfg.fp4_param_gather = True``, mixed_precision.py @v0.5.0).
* ``fp8_recipe``: how Transformer Engine scales FP8 tensors (Megatron-Core ``--fp8-recipe``):
  ``"delayed"`` (from an amax history: one read of each tensor per quantization), ``"tensorwise"``
  (current scaling, ``Float8CurrentScaling``: "FP8 Current Scaling requires two tensor reads per
  quantization: one to compute amax, one to cast", Transformer Engine docs, features/low_precision_training/
  fp8_delayed_scaling) or ``"mxfp8"`` (block scales computed in the casting pass: one read). Priced in
  ``layer_cost.fp8_cast_bytes``; it matters only for plans in float8 (float4 plans run NVFP4's own recipe).
* ``cross_entropy``: how the loss is computed over the logits. ``"upcast"``: log-softmax of the logits upcast
  to fp32, then NLL (meshplan's runtime, ``zoo.loss_fn``). ``"flash"``: FlashAttention's fused kernel over
  the 16-bit logits (``flash_attn.losses.cross_entropy.CrossEntropyLoss``, from Apex's xentropy: "We make it
  work for bfloat16 and support in-place backward to save memory", csrc/xentropy/README.md in
  Dao-AILab/flash-attention): it saves the logits in their own dtype and one float per token, and its
  backward writes one gradient of the logits in that dtype: 2 bytes a logit kept and 2 transient under bf16,
  where an upcast log-softmax keeps 4 and holds 8 more at its backward (``memory.logits_bytes``).
  ``"te"``: Transformer Engine's Triton kernel (``transformer_engine/pytorch/cross_entropy.py``, Megatron's
  ``cross_entropy_loss_fusion`` with ``cross_entropy_fusion_impl="te"``): its forward reads the logits twice
  (``online_softmax_kernel``, then ``cross_entropy_kernel``) and writes their gradient in fp32
  (``grad_input = torch.empty_like(_input, dtype=torch.float32)``), which it keeps instead of the logits;
  its backward scales that gradient in place by the incoming one (``element_mul_kernel``) and autograd casts
  it to the logits' dtype: 4 bytes a logit kept, 2 transient under bf16.
* ``expert_tp``: under TP the experts' FFNs are split over the tp ranks as the dense MLP is, each rank
  computing 1/tp of every local expert on the tokens of its TP group (Megatron-Core with
  ``--expert-tensor-parallel-size`` equal to ``--tensor-model-parallel-size``, which ``meshplan export
  --to megatron`` passes); else each tp rank keeps its experts whole and runs the whole MoE on the whole
  sequence (meshplan's runtime: ``codegen/tp_plans.py`` leaves the router and experts replicated over tp,
  splitting attention only), so TP shrinks neither the experts' weights nor their FLOPs.
* ``megatron_buckets``: the data-parallel gradients (and ZeRO-1's parameter gathers) are cut into buckets
  of max(40M, 1M x dp) parameters, Megatron-Core's default ("larger DP sizes need larger buckets to
  ensure collectives do not become latency-bound", ``DistributedDataParallelConfig.bucket_size`` in
  megatron/core/distributed/distributed_data_parallel_config.py; set in distributed_data_parallel.py,
  NVIDIA/Megatron-LM @d98e8a64dd), else PyTorch DDP's 25 MiB (``bucket_cap_mb``). Each bucket is a call
  that pays the collective's latency, which for a ring grows with the group (``collectives.ring_steps``).
* ``ep_dispatch``: how the MoE tokens reach their experts. ``"alltoall"``: an NCCL all-to-all of the k routed
  copies of every token (Megatron's ``--moe-token-dispatcher-type alltoall``; meshplan's runtime). ``"hybridep"``:
  Megatron's flex dispatcher with a DeepEP-style backend (``--moe-token-dispatcher-type flex
  --moe-flex-dispatcher-backend hybridep``), which "removes redundant tokens during cross-node communication"
  (megatron/core/transformer/moe/README.md, Token Dispatching, NVIDIA/Megatron-LM @d98e8a64dd): a token crosses
  the network once to each remote node that hosts one of its experts and is forwarded over NVLink there (the
  design of DeepSeek-V3's dispatch, arXiv:2412.19437 sec. 3.2.2), instead of once per expert
  (``collectives.deduplicated_all_to_all_time``). NVIDIA's perf recipes set it per workload
  (``moe_flex_dispatcher_backend="hybridep"`` in Megatron-Bridge scripts/performance/configs/*/
  *_workload_base_configs.py), so it has a preset of its own, ``megatron-core-perf-recipes-hybridep``.
* ``ep_routing``: which experts the router picks, as far as the dispatch's traffic sees it. ``"uniform"``: a
  learned router kept balanced by its loss, each token's k experts spread over the experts as if at random (every
  program but the one below). ``"round-robin"``: NeMo Automodel's benchmark gate (``FakeBalancedGate`` in
  nemo_automodel/components/moe/layers.py @89e3a9fdd: ``indices = arange(tokens * k).view(-1, k) % n_experts``,
  weights 1/k), so a token's experts are k consecutive ones, held by one or two ranks of one node; with the
  deduplicating dispatcher it crosses the network to that node only (``collectives.round_robin_spread``).
* ``ep_comm_overlap``: Megatron's 1F1B A2A overlap (``--overlap-moe-expert-parallel-comm``; Megatron-Bridge's
  ``moe_a2a_overlap``): the forward of one micro-batch and the backward of another run layer by layer as one
  schedule: "EP A2A in forward step is hidden by the attention/mlp computation in the backward step, and vice
  versa" (megatron/core/pipeline_parallel/combined_1f1b.py); only what exceeds that compute waits
  (``layer_cost._comm``). Megatron allows it with expert parallelism, without
  full recomputation, and under pipelining only with virtual stages (TransformerConfig.__post_init__,
  megatron/core/transformer/transformer_config.py @d98e8a64dd); ``estimate`` applies it where the plan meets
  those rules. The warm-up and cool-down micro-batches, which have no partner, are priced as overlapped too.
* ``fused_norm``: the program's RMSNorm is one fused kernel that reads its input once, writes its output once and
  keeps only its input (and a per-row fp32 rstd) for the backward, not an eager chain of upcast, square, mean,
  rsqrt and products that keeps fp32 tensors (``memory.eager_layer_bytes``, ``layer_cost.elementwise_fwd``):
  torchtitan's ``norm_type = "fused_rmsnorm"`` (torchtitan/models/norms.py ``FusedRMSNorm``, a Triton kernel after
  Tri Dao's, ``ctx.save_for_backward(x, weight, rstd)``; its Llama 3 8B and Llama 2 13B configs of @0413364 set it,
  its 70B configs ``rmsnorm``). Modifier ``+fused-norm``.
* ``compiled``: the program runs each transformer block under ``torch.compile``, whose Inductor backend fuses every
  chain of pointwise and reduction ops between two kernels it does not generate (the GEMMs, the fused attention)
  into one Triton kernel that reads the chain's inputs and writes its live outputs once (PyTorch's torch.compiler
  docs: TorchInductor "fuses" pointwise and reduction ops into generated Triton kernels; torchtitan compiles
  block by block, ``apply_compile`` in torchtitan/models/llama/parallelize_llama.py @9dec370). Per block forward
  (``layer_cost.elementwise_fwd``): the attention norm (its input in, its output out), rotary on q and k fused with
  the repeat of k and v for grouped-query attention, the attention output's copy, the residual add fused with the
  MLP norm, the gated or plain activation, the last residual add: 6 kernels. Modifier ``+compile``; torchtitan's
  H100 benchmark measured it at 6667 against 5762 tokens/s per GPU eager (Llama 3.1 8B on 8 GPUs, Table 1 of
  benchmarks/llama3_h100_202412_torchtitan.md @b5bcd76).
* ``attention_unpad``: the program runs its fused attention on unpadded (varlen) tensors: FlashAttention's
  ``bert_padding.unpad_input`` gathers the q, k and v of the tokens the key-padding mask keeps into new tensors
  before the kernel (``flash_attn_varlen_func``) and ``pad_input`` scatters its output back into a zero-filled
  (batch, sequence) tensor after it; the backward runs their transposes. llm-foundry's ``flash_attn_fn`` does so
  whatever the mask (llmfoundry/models/layers/attention.py @5e85bd62d: an all-ones mask where none is given, then
  ``unpadding_function`` on q, k and v and ``bert_padding.pad_input`` on the output), the path its ``attn_impl
  flash`` takes; its Triton kernel (``attn_impl triton``) runs on the padded tensors. Priced as memory-bound passes
  (``layer_cost.unpad_bytes``); the host syncs of ``unpad_input`` (``torch.nonzero``, ``.item()``) are not.
* ``window_kernel``: the program's fused attention skips the blocks outside a layer's sliding window
  (``ModelDims.attention_window``; ``flops.window_share`` of the causal work remains), at the rate cuDNN's window
  kernel reached where the accelerator has it measured at that window and head dim
  (``Accelerator.cudnn_window_attention``: a short window runs a few key tiles per query tile, far below the full
  kernel's rate), else at the full kernel's. Megatron-Core hands
  ``TransformerConfig.window_size`` to Transformer Engine's ``DotProductAttention``, whose cuDNN (FusedAttention) and
  FlashAttention backends take it as a band (TransformerEngine PR #1212, 2024: cuDNN's window made to match flash's);
  Megatron-Bridge's GPT-OSS bridge sets it to (sliding_window - 1, 0) on every other layer
  (src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py: ``window_size``, ``window_attn_skip_freq = 2``). Off for
  meshplan's runtime, which runs a traced model's own attention, where a window is a mask over the whole sequence.
* ``fused_grouped_mlp``: the experts' SwiGLU runs in the epilogue of their first grouped GEMM, forward and
  backward, which also writes the block-scaled (MXFP8) copies the second GEMM reads: no activation kernel and no
  quantization of its input or of the first GEMM's output gradient (``layer_cost.elementwise_fwd``,
  ``layer_cost.fp8_cast_bytes``). Megatron-Bridge's MXFP8 workload configs of the 26.06 release set
  ``cutedsl_fused_grouped_mlp=True`` for Qwen3, GPT-OSS and DeepSeek-V3 on GB200/GB300 (and Qwen3-30B on B300)
  (scripts/performance/configs/*/*_workload_base_configs.py @v0.5.0), which runs cuDNN's CuTe-DSL kernels:
  ``GroupedGemmSwigluSm100`` "contiguous grouped block-scaled GEMM with SwiGLU activation" writing the
  activation and its row- and column-quantized copies, and ``GroupedGemmDswigluSm100``, its backward "with
  dSwiGLU activation gradient" (python/cudnn/grouped_gemm/grouped_gemm_{swiglu,dswiglu}/api.py in
  NVIDIA/cudnn-frontend @3929da2).
* ``recompute_modules``: submodules whose outputs Megatron discards in the forward and recomputes in the
  backward (``--recompute-modules``; Megatron-Bridge's ``recompute_modules``), on top of the plan's recomputation:
  ``"layernorm"`` "recompute the input_layernorm and pre_mlp_layernorm", ``"moe_act"`` "recompute the MoE MLP
  activation function", both by "output-discarding checkpointing" (``TransformerConfig.recompute_modules``,
  megatron/core/transformer/transformer_config.py @d98e8a64dd). The backward pays their forward again
  (``layer_cost.recompute_modules_bytes``), and their outputs are not kept (``memory.discarded_units``).
  NVIDIA's GPT-OSS workload configs set ``["layernorm", "moe_act"]`` on GB200, B200 and H100 (Megatron-Bridge scripts/performance/configs/gpt_oss/*_workload_base_configs.py @v0.3.0 to
  @v0.4.1). Megatron's other modules (``"mla_up_proj"``, ``"mlp"``, ...) are not costed.
* ``optimizer``: how the AdamW step runs, which decides the temporaries it allocates beside its state.
  ``"foreach"``: torch.optim.AdamW's default on CUDA tensors (meshplan's runtime): ``_multi_tensor_adam`` takes
  ``exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)`` of every parameter at once (torch/optim/adam.py),
  a temporary as large as one fp32 state tensor of the rank's shard. ``"fused"``: a multi-tensor-apply kernel that
  updates parameters and state in place, with no temporary: Megatron-Core takes Transformer Engine's or Apex's
  ``FusedAdam`` (megatron/core/optimizer/__init__.py @d98e8a64dd; Megatron-LM 2021 took Apex's), DeepSpeed its
  own ``FusedAdam`` (deepspeed/ops/adam/fused_adam.py). ``"per_param"``: a Python loop over the parameters, each
  one's ``denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)`` made and dropped in its turn:
  Composer's ``DecoupledAdamW`` (composer/optim/decoupled_weight_decay.py @v0.15.0, ``adamw``: ``for i, param in
  enumerate(params)``), which llm-foundry's ``decoupled_adamw`` builds; two temporaries of one parameter's local
  shard at most (``footprint.optimizer_temp_bytes``).
* ``expandable_segments``: the program runs PyTorch's caching allocator with
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``: each stream's memory is one virtual segment whose
  physical pages are mapped as it grows and unmapped where blocks are free ("Using the cuMemMap-style APIs, it
  adds the ability to expand the last block in a segment when more memory is needed", pytorch/pytorch#96995;
  the CUDA semantics notes: it "can reduce fragmentation"), so freed gaps between live blocks do not strand
  memory, and the footprint takes no fragmentation allowance (``footprint.ALLOCATOR_FRACTION``), only the
  2 MiB page rounding, which it ignores. Else the default splitting allocator, whose fragmentation GMLake
  (Guo et al., ASPLOS 2024, arXiv:2401.08156, abstract) measured by undoing it: "an average of 9.2 GB (up to
  25 GB) GPU memory usage and 15% (up to 33%) fragmentation among eight LLM models on GPU A100 with 80 GB
  memory". NVIDIA's perf scripts set it per workload up to 26.04.01 and for every workload from 26.06
  (Megatron-Bridge scripts/performance/perf_plugins.py and utils/executors.py ``PERF_ENV_VARS``); the rows it
  applies to say so (``bench/reference_runs.py``).
* ``overlap_slowdown``: how much slower compute runs while a collective runs beside it (NCCL's
  kernels hold SMs and HBM bandwidth). Lee et al. 2025, "Characterizing Compute-Communication
  Overlap in GPU-Accelerated Distributed Deep Learning" (arXiv:2507.03114), abstract: overlapping
  slows the computation by 18.9% on average (40% at most) over GPT and Llama training on A100, H100,
  MI250 and MI210 with PyTorch and NCCL/RCCL; the mean is taken for every program, not fitted. It
  applies to the communication the model hides under compute, not to what waits.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir.errors import PlanError
from .memory import GEMM_OPERAND_BYTES

ATTENTION = ("flash", "plain")
ATTENTION_KERNELS = ("fa2", "cudnn")
FP8_RECIPES = ("delayed", "tensorwise", "mxfp8")
EP_DISPATCH = ("alltoall", "hybridep")
EP_ROUTING = ("uniform", "round-robin")
CROSS_ENTROPY = ("upcast", "flash", "te")
RECOMPUTE_MODULES = ("layernorm", "moe_act")
OPTIMIZERS = ("foreach", "fused", "per_param")


@dataclass(frozen=True, slots=True, kw_only=True)
class Software:
    name: str
    attention: str = "flash"
    attention_speed: float = 1.0
    attention_kernel: str = "fa2"
    dropout: bool = False
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    sp_regather: bool = False
    tp_comm_overlap: bool = False
    fp32_grad_reduce: bool = False
    zero1_allreduce: bool = False
    zero3_prefetch_params: float | None = None
    zero3_flat: bool = False
    zero3_regather_recompute: bool = False
    zero_copy_buffers: bool = False
    vocab_parallel_loss: bool = True
    fp32_params: bool = False
    master_weights: bool = True
    dtensor_tp_styles: bool = False
    fsdp_plain_dp: bool = False
    ddp_accumulation_copy: bool = False
    eager_modules: bool = False
    grad_accumulation_add: bool = False
    fsdp_under_pipeline: bool = False
    selective_saves_matmuls: bool = False
    selective_alternate_matmuls: bool = False
    fused_norm: bool = False
    compiled: bool = False
    attention_unpad: bool = False
    window_kernel: bool = False
    search_space: str = "meshplan"
    overlap_slowdown: float = 0.189
    cross_entropy: str = "upcast"
    offload_overlap: bool = False
    fp8_param_gather: bool = False
    fp8_recipe: str = "delayed"
    expert_tp: bool = False
    megatron_buckets: bool = False
    ep_dispatch: str = "alltoall"
    ep_routing: str = "uniform"
    ep_comm_overlap: bool = False
    fused_grouped_mlp: bool = False
    recompute_modules: tuple[str, ...] = ()
    optimizer: str = "foreach"
    expandable_segments: bool = False

    def __post_init__(self) -> None:
        if self.attention not in ATTENTION:
            raise PlanError(f"software {self.name!r}: attention must be one of {ATTENTION}, got {self.attention!r}")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise PlanError(f"software {self.name!r}: attention_kernel must be one of {ATTENTION_KERNELS}, "
                            f"got {self.attention_kernel!r}")
        if self.fp8_recipe not in FP8_RECIPES:
            raise PlanError(f"software {self.name!r}: fp8_recipe must be one of {FP8_RECIPES}, got {self.fp8_recipe!r}")
        if self.cross_entropy not in CROSS_ENTROPY:
            raise PlanError(f"software {self.name!r}: cross_entropy must be one of {CROSS_ENTROPY}, "
                            f"got {self.cross_entropy!r}")
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown or isinstance(self.recompute_modules, str):
            raise PlanError(f"software {self.name!r}: recompute_modules must be a tuple of {RECOMPUTE_MODULES}, "
                            f"got {self.recompute_modules!r}")
        if self.optimizer not in OPTIMIZERS:
            raise PlanError(f"software {self.name!r}: optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.ep_dispatch not in EP_DISPATCH:
            raise PlanError(f"software {self.name!r}: ep_dispatch must be one of {EP_DISPATCH}, got {self.ep_dispatch!r}")
        if self.ep_routing not in EP_ROUTING:
            raise PlanError(f"software {self.name!r}: ep_routing must be one of {EP_ROUTING}, got {self.ep_routing!r}")
        if self.zero3_prefetch_params is not None and not self.zero3_prefetch_params > 0:
            raise PlanError(f"software {self.name!r}: zero3_prefetch_params must be positive or None, "
                            f"got {self.zero3_prefetch_params!r}")
        if self.search_space not in ("meshplan", "megatron"):
            raise PlanError(f"software {self.name!r}: search_space must be meshplan or megatron, got {self.search_space!r}")
        if not 0 < self.attention_speed <= 2:
            raise PlanError(f"software {self.name!r}: attention_speed must be in (0, 2], got {self.attention_speed!r}")
        if self.selective_alternate_matmuls and not self.selective_saves_matmuls:
            raise PlanError(f"software {self.name!r}: selective_alternate_matmuls refines selective_saves_matmuls, "
                            "which is off")
        if not 0 <= self.overlap_slowdown < 1:
            raise PlanError(f"software {self.name!r}: overlap_slowdown must be in [0, 1), got {self.overlap_slowdown!r}")

    def drops_out(self, family: str) -> bool:
        """Whether this program runs dropout in a model of ``family`` (``dropout``: GPT only)."""
        return self.dropout and family == "gpt"

    def splits_experts_over_tp(self, ep_over_tp: bool) -> bool:
        """Whether each expert's FFN is split over the tp ranks (``expert_tp``); never when the ep group takes
        the tp ranks (``ir.Mesh.ep_over_tp``: each expert whole on its ranks)."""
        return self.expert_tp and not ep_over_tp

    def reduces_grads_in_fp32(self, zero_stage: int) -> bool:
        """Whether the gradients of a plan at ``zero_stage`` are accumulated and reduced in fp32
        (``fp32_grad_reduce``). Not under Megatron-FSDP, ZeRO-3 of a Megatron-Core program (``megatron_buckets``):
        its main gradients and their reduce-scatter take the model's own dtype unless told otherwise
        (``--megatron-fsdp-main-grads-dtype`` and ``--megatron-fsdp-grad-comm-dtype`` default to "auto", "the native
        model gradient data-type", in Megatron-LM megatron/training/arguments.py @d98e8a64dd), whatever
        Megatron-LM's fp32 accumulation of the distributed optimizer says."""
        return self.fp32_grad_reduce and not (zero_stage == 3 and self.megatron_buckets)

    def overlaps_tp_comm(self, dtype: str) -> bool:
        """Whether a plan in ``dtype`` runs its TP communication under the GEMMs (``tp_comm_overlap``; never
        under NVFP4, float4: the module docstring)."""
        return self.tp_comm_overlap and dtype != "float4"

    def keeps_fp8_weights(self, dtype: str, zero_stage: int) -> bool:
        """Whether a plan in ``dtype`` at ``zero_stage`` keeps its weights in FP8, or NVFP4 (``fp8_param_gather``: with
        the distributed optimizer, ZeRO-1, only)."""
        return self.fp8_param_gather and dtype in GEMM_OPERAND_BYTES and zero_stage == 1


# meshplan's runtime: SDPA (flash) attention, no dropout in the zoo, DDP/FSDP2 overlap their
# reductions with the backward and FSDP2 prefetches the next layer (and copies parameters out of,
# gradients into, its flat collective buffers); ZeRO-1 is DDP + ZeroRedundancyOptimizer
# (runtime/planned.py); gradients reduced in fp32 under every compute dtype (codegen/precision.py
# ``REDUCE_DTYPE``: FSDP2's ``reduce_dtype``, and DDP's all-reduce of the fp32 parameters' gradients).
DEFAULT = Software(name="meshplan", zero1_allreduce=True, zero_copy_buffers=True, vocab_parallel_loss=True,
                   fp32_grad_reduce=True,
                   dtensor_tp_styles=True, fsdp_plain_dp=True, ddp_accumulation_copy=True, fsdp_under_pipeline=True,
                   eager_modules=True, grad_accumulation_add=True, fp32_params=True,
                   selective_saves_matmuls=True)

# torchtitan (pytorch/torchtitan): the same PyTorch stack as meshplan's runtime (FSDP2, DTensor TP, SDPA, eager
# modules), with its own op-level selective activation checkpointing (``selective_alternate_matmuls``), which
# ``meshplan export --to torchtitan`` writes for a selective plan (``selective_ac_option = "op"``). Its published
# FSDP2 runs (bench/data/torchtitan_runs.csv) are costed as this program. A float8 plan of it is torchao's
# Float8Linear with tensorwise dynamic scaling (torchtitan's ``float8`` converter, the recipe of its published runs),
# which ``+float8`` names; ``+compile`` adds its per-block torch.compile (``compiled``). Its FSDP2 reduce-scatters in
# fp32 as meshplan's runtime does (``--training.mixed_precision_reduce``, whose only choice is "float32" in
# torchtitan/config_manager.py @ba24697, December 2024).
TORCHTITAN = dataclasses.replace(DEFAULT, name="torchtitan", selective_alternate_matmuls=True, fp8_recipe="tensorwise")

# Megatron-LM before FlashAttention, as Narayanan et al. 2021 (arXiv:2104.04473) and Korthikanti et
# al. 2022 (arXiv:2205.05198) ran it: CoreAttention with baddbmm + FusedScaleMaskSoftmax + dropout
# (the 5as^2b bytes of Korthikanti sec. 4 are its saved tensors, and selective recomputation exists
# because they are large); GPT dropout 0.1; the data-parallel all-reduce runs after the backward
# (``allreduce_gradients`` in ``train_step``; bucketed overlap came with Megatron-Core in 2023).
MEGATRON_LM_2021 = Software(name="megatron-lm-2021", attention="plain", dropout=True, overlap_grad_reduce=False,
                            sp_regather=True, search_space="megatron", optimizer="fused")

# DeepSpeed ZeRO-3 on Megatron's GPT as in Narayanan et al. 2021 Table 2: the model code of
# Megatron-LM 2021 (unfused attention, dropout); ZeRO-3 with the defaults of its config (5e7
# prefetch bucket); collectives over the whole data-parallel group, costed per GPU on its own link
# as ZeRO++ does (Wang et al. 2023, arXiv:2306.10209, sec. 3: ZeRO-3 moves 3M across nodes per
# step, which its hierarchical partitioning hpZ later cut); parameters fetched again for the
# recomputed forward (Rajbhandari et al. 2021, ZeRO-Infinity, arXiv:2104.07857, sec. 4.1: with
# activation checkpointing parameters are loaded three times, forward, recompute and backward).
DEEPSPEED_ZERO3_2021 = Software(name="deepspeed-zero3-2021", attention="plain", dropout=True,
                                zero3_prefetch_params=5e7, zero3_flat=True, zero3_regather_recompute=True,
                                search_space="megatron", optimizer="fused")

# Megatron-Core as in its README's H100 table (2024): FlashAttention through Transformer Engine; the
# overlaps the table lists (--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap); dropout
# at Megatron's defaults (--hidden-dropout 0.1, --attention-dropout 0.1 in megatron/training/arguments.py);
# bf16 gradients reduced in fp32 (forced for bf16 in the same file); Transformer Engine's or Apex's FusedAdam; and
# Transformer Engine's fused norm kernels (``fused_norm``): its layer spec fuses the input norm into the QKV GEMM's
# module and the MLP's norm into fc1's, or runs ``TENorm`` before the experts (``TELayerNormColumnParallelLinear``,
# megatron/core/models/gpt/gpt_layer_specs.py @core_v0.16.0; transformer_engine/common/normalization).
MEGATRON_CORE_2024 = Software(name="megatron-core-2024", dropout=True, overlap_grad_reduce=True,
                              overlap_param_gather=True, sp_regather=True, tp_comm_overlap=True,
                              fp32_grad_reduce=True, search_space="megatron", offload_overlap=True,
                              fp8_param_gather=True, expert_tp=True, megatron_buckets=True,
                              optimizer="fused", window_kernel=True, fused_norm=True)

# Megatron-Core as NVIDIA's published performance recipes run it: as above, but every benchmark keeps and
# reduces gradients in bf16 (grad_reduce_in_fp32=False): Megatron-Bridge ``_benchmark_common`` and
# ``_perf_precision`` (src/megatron/bridge/perf_recipes/_common.py @067f987df0), NeMo
# ``set_precision_configs`` (scripts/performance/helpers.py @8cfedd7203); and the loss is Transformer Engine's
# fused cross-entropy: ``_benchmark_common`` sets ``cross_entropy_fusion_impl`` to "te" (its default) and
# Megatron-Bridge's ``GPTModelProvider`` turns ``cross_entropy_loss_fusion`` on (models/gpt_provider.py). The
# attention is cuDNN's: the recipes leave ``attention_backend`` unset (None: Transformer Engine chooses; e.g.
# src/megatron/bridge/recipes/llama/llama3.py @v0.4.0), and TE's ``DotProductAttention`` runs its cuDNN
# ``FusedAttention`` backend on Hopper and Blackwell, priced at NVIDIA's 2026 cuDNN training benchmark
# (``Accelerator.cudnn_attention_by_seq_len``: cuDNN 9.19 on H200, 9.22 on GB200 and GB300). Their FP8 is current
# scaling: the tables' "FP8" is ``fp8_cs``, ``bf16_with_fp8_current_scaling_mixed`` (Megatron-Bridge
# scripts/performance/utils/precision.py @v0.4.0); their "MXFP8" rows take ``fp8_recipe="mxfp8"``.
MEGATRON_CORE_PERF_RECIPES = dataclasses.replace(MEGATRON_CORE_2024, name="megatron-core-perf-recipes",
                                                 fp32_grad_reduce=False, cross_entropy="te", attention_kernel="cudnn",
                                                 fp8_recipe="tensorwise")

# NeMo's performance scripts of 2024 (containers 24.03-25.04; scripts/performance @8cfedd7203): the program above,
# with the attention priced at FlashAttention-2's published rate: no benchmark of the cuDNN those containers
# shipped is published, and the cuDNN curves above were measured two years later. (On H100 its long-sequence
# table, 4K to 1M tokens, sits within 5% of FA2's rate and 50-75% below cuDNN 9.19's.) Its FP8 is delayed
# scaling: Megatron-Core builds Float8CurrentScaling only with Transformer Engine >= 2.2 (megatron/core/fp8_utils.py),
# released in 2025.
NEMO_PERF_RECIPES_2024 = dataclasses.replace(MEGATRON_CORE_PERF_RECIPES, name="nemo-perf-recipes-2024",
                                             attention_kernel="fa2", fp8_recipe="delayed")

# The same recipes where they dispatch MoE tokens with Megatron's flex dispatcher and the HybridEP backend
# (``moe_flex_dispatcher_backend="hybridep"`` in the workload's base config: every DeepSeek-V3 one, and some
# Qwen3 and GPT-OSS ones, in Megatron-Bridge scripts/performance/configs @v0.3.0 and @v0.4.0).
MEGATRON_CORE_PERF_RECIPES_HYBRIDEP = dataclasses.replace(MEGATRON_CORE_PERF_RECIPES,
                                                          name="megatron-core-perf-recipes-hybridep",
                                                          ep_dispatch="hybridep")

# MosaicML llm-foundry v0.3.0 as its MPT benchmark tables ran it (scripts/train/benchmarking/README.md
# @b2a43a147, 2023-10-19; submit_benchmarks.py and sweep.sh there): Composer 0.16 with PyTorch FSDP1
# FULL_SHARD; mixed precision DEFAULT (run_config never passes the PURE flag): fp32 sharded parameters
# gathered in bf16, gradients reduced in fp32 (composer/trainer/mosaic_fsdp_utils.py); use_orig_params,
# so parameters are views into the FlatParameter (no copy out, no copy in); eager modules under autocast
# (bf16 LayerNorm, GELU); attention by llmfoundry/models/layers/flash_attn_triton.py ("Copied from"
# Tri Dao's FlashAttention-1-era Triton kernel, default attn_impl triton) at FA1's rate. MPT's own modules
# (llmfoundry/models/layers: one fused Wqkv, the flash kernel's q, k, v, output and statistics, LPLayerNorm in
# bf16, GELU) keep what Korthikanti's count of fused modules does, not the zoo's eager tensors: not eager_modules.
# The loss is FlashAttention's fused cross-entropy: ``ComposerMPTCausalLM`` defaults ``loss_fn`` to
# ``fused_crossentropy`` (llmfoundry/models/mpt/modeling_mpt.py @b2a43a147 line 724, @5e85bd62d line 981), which
# no benchmark yaml overrides (only mpt-small-cpu.yaml and testing.yaml set torch_crossentropy), and the gpu
# extra installs its xentropy kernel (setup.py: xentropy-cuda-lib from flash-attention's csrc/xentropy). The optimizer is
# Composer's DecoupledAdamW (mpt-*.yaml: ``optimizer: name: decoupled_adamw``), a loop over the parameters.
LLM_FOUNDRY_2023 = dataclasses.replace(DEFAULT, name="llm-foundry-2023", attention_speed=0.44, fp32_grad_reduce=True,
                                       zero_copy_buffers=False, eager_modules=False, cross_entropy="flash",
                                       optimizer="per_param")

# The same program with Composer's FSDP mixed precision PURE (bf16 parameters gathered, gradients reduced in
# bf16; the sharded parameters FSDP1 keeps stay fp32): llm-foundry's tables before b2a43a147 (the A100 40GB
# table of 300cc5c58, 2023-05-03, and two A100 80GB 70b rows b2a43a147 kept), whose MP Mode column says PURE.
LLM_FOUNDRY_2023_PURE = dataclasses.replace(LLM_FOUNDRY_2023, name="llm-foundry-2023-pure", fp32_grad_reduce=False)

# llm-foundry's large-scale H100 table (README @5e85bd62d, 2024-01-06) ran llm-foundry main with Composer 0.17.2
# and, for the models its sweep.py gives attn_impl flash, FlashAttention-2 (flash-attn 2.4.2): the 2023 program
# with FA2's attention rate, on the unpadded tensors its ``flash_attn_fn`` gathers (``attention_unpad``). (Its sweep
# also turns on forward prefetch and BACKWARD_PRE, which this preset does not distinguish: FSDP's gathers are priced
# as prefetched either way.)
LLM_FOUNDRY_2024 = dataclasses.replace(LLM_FOUNDRY_2023, name="llm-foundry-2024", attention_speed=1.0,
                                       attention_unpad=True)

# NVIDIA NeMo Automodel's MoE pre-training benchmarks (docs/performance-summary.md @89e3a9fdd, 2025-10-06; its
# configs examples/benchmark/configs/*_te_deepep.yaml and nemo_automodel/components there): PyTorch FSDP2 over the
# data-parallel ranks (moe/parallelizer.py ``apply_fsdp``: ``MixedPrecisionPolicy(param_dtype=bf16,
# reduce_dtype=float32)``, so gradients are reduce-scattered in fp32; ``reshard_after_forward = not pp_enabled``:
# ZeRO-3 without pipelining, ZeRO-2 under it) inside torch.distributed.pipelining's interleaved 1F1B; Transformer
# Engine's Linear, RMSNorm and DotProductAttention modules (its cuDNN fused attention on Hopper), not eager
# PyTorch ones; DeepEP's dispatch, which sends a token once per remote node (the dedup the hybridep dispatcher
# prices); ``F.cross_entropy`` on the bf16 logits (``MaskedCrossEntropy(fp32_upcast=False)``, loss/masked_ce.py):
# no fp32 copy, priced as the fused kernel that keeps the logits in their dtype; ``torch.optim.Adam`` with
# torch's default (foreach) implementation; no CUDA graphs; the benchmark's fake balanced gate, which routes token
# t to experts t*k .. t*k+k-1 (mod E), so a token's experts sit on one or two ranks of one node
# (``ep_routing="round-robin"``); the parameters and Adam's moments stored in bf16, with no fp32 master weights
# (``initialize_weights`` ends ``self.to(bf16)``; ``master_weights=False``). Not carried: the gate has no router
# GEMM; the optimizer step's bytes are priced as a master-weight step's (``data_parallel.OPTIMIZER_BYTES_PER_PARAM``,
# more than a bf16 step moves); the host waits on the GPU in every MoE layer (``tokens_per_expert.sum().item()`` in
# the token dispatcher), which is not priced.
NEMO_AUTOMODEL_2025 = dataclasses.replace(DEFAULT, name="nemo-automodel-2025", fp32_params=False, master_weights=False,
                                          eager_modules=False, fused_norm=True, attention_kernel="cudnn",
                                          fp32_grad_reduce=True, cross_entropy="flash", ep_dispatch="hybridep",
                                          ep_routing="round-robin")

SOFTWARE = {s.name: s for s in (DEFAULT, TORCHTITAN, MEGATRON_LM_2021, DEEPSPEED_ZERO3_2021, MEGATRON_CORE_2024,
                                MEGATRON_CORE_PERF_RECIPES, MEGATRON_CORE_PERF_RECIPES_HYBRIDEP, NEMO_PERF_RECIPES_2024,
                                LLM_FOUNDRY_2023,
                                LLM_FOUNDRY_2023_PURE, LLM_FOUNDRY_2024, NEMO_AUTOMODEL_2025)}


# What a program sets beyond its preset, as a suffix of its name: ``megatron-core-perf-recipes+mxfp8+expandable``.
# Each one sets a field (the module docstring); a plan file keeps the name, so the plan is costed again as it was.
# ``fp8-delayed``: FP8 scaled from an amax history (Megatron-Core's ``--fp8-recipe`` default, "delayed"), for a program
# of a preset whose FP8 is current scaling; ``no-dropout``: a GPT model run with ``hidden_dropout`` and
# ``attention_dropout`` 0 (e.g. MLPerf's GPT-3 175B: conf/custom.yaml of NVIDIA's training_results_v4.1 submissions).
# PyTorch-native programs (torchtitan): ``compile`` (``compiled``); ``float8``: torchao's Float8Linear with its default
# tensorwise dynamic scaling (each GEMM operand's amax taken and cast when used: ``fp8_recipe`` "tensorwise", the
# current scaling Transformer Engine prices the same way), for a plan in float8. Not a modifier: torchtitan's
# asynchronous TP (Inductor's micro-pipelined all-gather and reduce-scatter matmuls), which ``tp_comm_overlap`` (the
# userbuffer overlap of Megatron's TP) does not describe: priced as it, torchtitan's 70B FSDP 32 x TP 8 run would gain
# 30%, against the 5.7% measured (Table 4 of benchmarks/llama3_h100_202412_torchtitan.md @b5bcd76).
# ``fp32-grads``: gradients accumulated and reduced in fp32, for a program of a preset that reduces them in bf16: what
# Megatron-LM runs in bf16 unless told ``--grad-reduce-in-bf16`` (megatron/training/arguments.py), as NVIDIA's
# MoE model zoo's scripts run it (yanring/Megatron-MoE-ModelZoo sbatch_benchmarking.sh, which NVIDIA's perf recipes'
# ``grad_reduce_in_fp32=False`` is not).
MODIFIERS = {"mxfp8": {"fp8_recipe": "mxfp8"}, "fp8-delayed": {"fp8_recipe": "delayed"},
             "fp32-grads": {"fp32_grad_reduce": True},
             "ep-overlap": {"ep_comm_overlap": True}, "fused-mlp": {"fused_grouped_mlp": True},
             "expandable": {"expandable_segments": True}, "fused-norm": {"fused_norm": True},
             "no-dropout": {"dropout": False}, "compile": {"compiled": True},
             "float8": {"fp8_recipe": "tensorwise"}}
RECOMPUTE_PREFIX = "recompute-"  # recompute-layernorm-moe_act: Software.recompute_modules


def software_named(name: str) -> Software:
    """A preset by name, with the modifiers its name adds after ``+`` (``MODIFIERS``, ``recompute-<modules>``)."""
    if not isinstance(name, str):
        raise PlanError(f"software must be a name, got {name!r}")
    base, *mods = name.split("+")
    if base not in SOFTWARE:
        raise PlanError(f"unknown software {base!r}; known: {', '.join(SOFTWARE)}")
    if mods and base == DEFAULT.name:
        raise PlanError(f"software {name!r}: meshplan's runtime is the program emit and run execute, with no "
                        "modifiers; they describe another framework's program (e.g. megatron-core-perf-recipes+expandable)")
    fields: dict[str, object] = {}
    for mod in mods:
        if mod in MODIFIERS:
            fields.update(MODIFIERS[mod])
        elif mod.startswith(RECOMPUTE_PREFIX) and mod != RECOMPUTE_PREFIX:
            modules = tuple(m for m in RECOMPUTE_MODULES if m in mod[len(RECOMPUTE_PREFIX):].split("-"))
            if "-".join(modules) != mod[len(RECOMPUTE_PREFIX):]:
                raise PlanError(f"software {name!r}: {mod!r} must name modules of {RECOMPUTE_MODULES} in that order, "
                                f"joined by '-' (e.g. {RECOMPUTE_PREFIX}{'-'.join(RECOMPUTE_MODULES)})")
            fields["recompute_modules"] = modules
        else:
            raise PlanError(f"software {name!r}: unknown modifier {mod!r}; known: {', '.join(MODIFIERS)}, "
                            f"{RECOMPUTE_PREFIX}<{'|'.join(RECOMPUTE_MODULES)}, joined by '-'>")
    return dataclasses.replace(SOFTWARE[base], name=name, **fields) if mods else SOFTWARE[base]
