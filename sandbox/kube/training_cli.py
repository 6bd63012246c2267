"""Recorded command-line interfaces of the training launchers the sandbox's simulated workloads run.

Each :class:`Cli` holds the flag set of a real CLI (with where it was recorded from), and
:func:`check` parses an argv against it the way the real program does, so that a rendered command with a
flag the real CLI lacks fails in the sandbox with the real program's error and exit code. Recipes check
their rendered commands against these specs too.

* ``torchrun`` / ``python -m torch.distributed.run``: argparse (``allow_abbrev`` on), every option in its
  ``--a-b`` and ``--a_b`` spellings, the training script and its arguments as ``REMAINDER``; an unknown
  option is ``torchrun: error: unrecognized arguments: ...`` and exit 2.
* ``hyperpodrun``: torchrun's options plus the HyperPod elastic agent's.
* ``llamafactory-cli train <yaml> [key=value ...]``: the YAML's and the overrides' keys are
  ``HfArgumentParser`` dataclass fields; an unknown key raises ``ValueError: Some specified arguments are
  not used by the HfArgumentParser: [...]`` (exit 1).
* ``swift sft|pt|rlhf``: ms-swift's argument names; leftovers raise ``ValueError: remaining_argv: [...]``
  (exit 1) unless ``--ignore_args_error true``.
* ``python3 -m verl.trainer.main_ppo``: Hydra overrides; a key outside the config's top-level groups fails
  with Hydra's ``Could not override`` error (exit 1); ``+key=value`` appends are accepted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import yaml

# --- torchrun ------------------------------------------------------------------------------------------
# torch/distributed/run.py get_args_parser() (torch 2.6-2.8): options taking one value, and store_true flags.
TORCHRUN_SOURCE = "pytorch/pytorch torch/distributed/run.py get_args_parser (v2.6-v2.8)"
_TORCHRUN_VALUED = ("nnodes", "nproc-per-node", "rdzv-backend", "rdzv-endpoint", "rdzv-id", "rdzv-conf",
                    "max-restarts", "monitor-interval", "start-method", "event-log-handler", "role", "log-dir",
                    "redirects", "tee", "local-ranks-filter", "node-rank", "master-addr", "master-port",
                    "local-addr", "logs-specs", "signals-to-handle", "numa-binding")
_TORCHRUN_FLAGS = ("standalone", "module", "no-python", "run-path", "virtual-local-rank")
_TORCHRUN_SHORT = {"-m": "module", "-r": "redirects", "-t": "tee"}

# The HyperPod elastic agent's own options (PyPI hyperpod-elastic-agent 1.x project description, and the
# incumbent's templates: --server-host --server-port --tee --log_dir --pre/post-train-script).
HYPERPODRUN_SOURCE = ("pypi.org/project/hyperpod-elastic-agent (1.0.0, 1.1.0) 'HyperPod elastic agent "
                      "arguments' + torchrun's; xqun3/HyperPod-InstantStart hyperpodrun-job-template.yaml")
_HYPERPOD_VALUED = ("server-host", "server-port", "server-log-level", "server-shutdown-timeout",
                    "shutdown-signal", "shutdown-timeout", "pre-train-script", "pre-train-args",
                    "post-train-script", "post-train-args", "inprocess-timeout")
_HYPERPOD_FLAGS = ("inprocess-restart",)


@dataclass(frozen=True)
class Launch:
    """A parsed launcher invocation: its options (canonical dashed names) and the script with its args."""

    options: dict[str, str]
    script: list[str] = field(default_factory=list)


class CliError(Exception):
    """What the real program prints (its last lines) and the exit code it ends with."""

    def __init__(self, lines: list[str], exit_code: int) -> None:
        super().__init__("\n".join(lines))
        self.lines = lines
        self.exit_code = exit_code


def _argparse_usage(prog: str) -> str:
    return (f"usage: {prog} [-h] [--nnodes NNODES] [--nproc-per-node NPROC_PER_NODE] [--rdzv-backend RDZV_BACKEND] "
            "... training_script ...")


def parse_launcher(prog: str, argv: list[str]) -> Launch:
    """Parse ``argv`` (without the program name) as ``torchrun`` or ``hyperpodrun`` does; :class:`CliError`
    with argparse's message and exit 2 when it would refuse it."""
    valued = set(_TORCHRUN_VALUED) | (set(_HYPERPOD_VALUED) if prog == "hyperpodrun" else set())
    flags = set(_TORCHRUN_FLAGS) | (set(_HYPERPOD_FLAGS) if prog == "hyperpodrun" else set())
    options: dict[str, str] = {}
    unknown: list[str] = []
    i = 0

    def fail(message: str) -> CliError:
        return CliError([_argparse_usage(prog), f"{prog}: error: {message}"], 2)

    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break  # the training script: everything from here is its REMAINDER
        name, eq, value = arg.partition("=")
        if name in _TORCHRUN_SHORT:
            canonical = _TORCHRUN_SHORT[name]
        elif name.startswith("--"):
            wanted = name[2:].replace("_", "-")
            exact = wanted if wanted in valued | flags else None
            prefixed = sorted(o for o in valued | flags if o.startswith(wanted))
            if exact is None and len(prefixed) > 1:
                raise fail(f"ambiguous option: {name} could match " + ", ".join(f"--{o}" for o in prefixed))
            canonical = exact or (prefixed[0] if prefixed else "")
        else:
            canonical = ""
        if not canonical:
            unknown.append(arg)
            i += 1
            continue
        if canonical in flags:
            if eq:
                raise fail(f"argument --{canonical}: ignored explicit argument '{value}'")
            options[canonical] = "true"
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                raise fail(f"argument --{canonical}: expected one argument")
            value = argv[i + 1]
            i += 1
        options[canonical] = value
        i += 1
    script = argv[i:]
    if not script:
        raise fail("the following arguments are required: training_script, training_script_args")
    if unknown:
        raise fail("unrecognized arguments: " + " ".join(unknown))
    return Launch(options, script)


# --- LLaMA-Factory ---------------------------------------------------------------------------------------
LLAMAFACTORY_SOURCE = ("hiyouga/LLaMA-Factory src/llamafactory/hparams/{model,data,finetuning,generating}_args.py "
                       "+ transformers Seq2SeqTrainingArguments (v0.9.x); examples/train_lora/*.yaml")
LLAMAFACTORY_KEYS = frozenset({
    # ModelArguments
    "model_name_or_path", "adapter_name_or_path", "cache_dir", "use_fast_tokenizer", "resize_vocab",
    "split_special_tokens", "model_revision", "low_cpu_mem_usage", "rope_scaling", "flash_attn", "shift_attn",
    "use_unsloth", "enable_liger_kernel", "moe_aux_loss_coef", "disable_gradient_checkpointing",
    "upcast_layernorm", "upcast_lmhead_output", "infer_backend", "hf_hub_token", "ms_hub_token",
    "trust_remote_code", "quantization_bit", "quantization_method", "double_quantization", "image_max_pixels",
    "video_max_pixels", "print_param_status",
    # DataArguments
    "template", "dataset", "eval_dataset", "dataset_dir", "media_dir", "cutoff_len", "train_on_prompt",
    "mask_history", "streaming", "buffer_size", "mix_strategy", "interleave_probs", "overwrite_cache",
    "preprocessing_batch_size", "preprocessing_num_workers", "max_samples", "eval_num_beams",
    "ignore_pad_token_for_loss", "val_size", "packing", "neat_packing", "tool_format", "tokenized_path",
    # FinetuningArguments
    "stage", "finetuning_type", "lora_target", "lora_rank", "lora_alpha", "lora_dropout", "additional_target",
    "loraplus_lr_ratio", "use_rslora", "use_dora", "pissa_init", "freeze_trainable_layers",
    "freeze_trainable_modules", "freeze_vision_tower", "pref_beta", "pref_loss", "pref_ftx", "dpo_label_smoothing",
    "kto_chosen_weight", "kto_rejected_weight", "ppo_buffer_size", "ppo_epochs", "reward_model",
    "reward_model_type", "plot_loss", "include_effective_tokens_per_second", "compute_accuracy",
    "use_badam", "use_galore", "use_apollo", "deepspeed_config",
    # GeneratingArguments
    "do_sample", "temperature", "top_p", "top_k", "num_beams", "max_length", "max_new_tokens",
    "repetition_penalty", "length_penalty", "default_system",
    # transformers TrainingArguments (the keys recipes set)
    "output_dir", "overwrite_output_dir", "do_train", "do_eval", "do_predict", "eval_strategy", "eval_steps",
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "learning_rate",
    "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "num_train_epochs", "max_steps",
    "lr_scheduler_type", "warmup_ratio", "warmup_steps", "logging_dir", "logging_strategy", "logging_steps",
    "save_strategy", "save_steps", "save_total_limit", "save_only_model", "seed", "bf16", "fp16", "tf32",
    "ddp_timeout", "dataloader_num_workers", "run_name", "report_to", "deepspeed", "gradient_checkpointing",
    "resume_from_checkpoint", "optim", "load_best_model_at_end", "metric_for_best_model", "push_to_hub",
    "remove_unused_columns", "predict_with_generate", "torch_compile", "ddp_find_unused_parameters",
})


def parse_overrides(items: list[str]) -> dict[str, str]:
    """``key=value`` (LLaMA-Factory's OmegaConf dotlist) or ``--key value`` pairs."""
    parsed: dict[str, str] = {}
    i = 0
    while i < len(items):
        item = items[i]
        if item.startswith("--"):
            key, eq, value = item[2:].partition("=")
            if not eq and i + 1 < len(items) and not items[i + 1].startswith("--"):
                value = items[i + 1]
                i += 1
            elif not eq:
                value = "true"
            parsed[key] = value
        else:
            key, _, value = item.partition("=")
            parsed[key] = value
        i += 1
    return parsed


def llamafactory_config(config_file: str, text: str | None, overrides: dict[str, str]) -> dict[str, str]:
    """The settings ``llamafactory-cli train <yaml> key=value …`` runs with: the YAML's top-level keys with the
    overrides merged over them (OmegaConf), checked as ``HfArgumentParser.parse_dict`` checks them."""
    if text is None:
        raise CliError(["Traceback (most recent call last):",
                        '  File "/usr/local/bin/llamafactory-cli", line 8, in <module>',
                        f"FileNotFoundError: [Errno 2] No such file or directory: '{config_file}'"], 1)
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(["Traceback (most recent call last):", f"yaml.scanner.ScannerError: {exc}"], 1) from None
    if not isinstance(loaded, dict):
        raise CliError(["Traceback (most recent call last):",
                        f"ValueError: {config_file} is not a mapping of arguments"], 1)
    merged = {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
              for k, v in loaded.items()}
    merged.update(overrides)
    unused = sorted(k for k in merged if k not in LLAMAFACTORY_KEYS)
    if unused:
        raise CliError(["Traceback (most recent call last):",
                        '  File "/usr/local/bin/llamafactory-cli", line 8, in <module>',
                        f"ValueError: Some keys are not used by the HfArgumentParser: {unused}"], 1)
    return merged


def check_llamafactory(keys: dict[str, str]) -> None:
    unused = [k for k in keys if k not in LLAMAFACTORY_KEYS]
    if unused:
        raise CliError(["Traceback (most recent call last):",
                        '  File "/usr/local/bin/llamafactory-cli", line 8, in <module>',
                        f"ValueError: Some specified arguments are not used by the HfArgumentParser: {unused}"], 1)


# --- ms-swift --------------------------------------------------------------------------------------------
SWIFT_SOURCE = ("modelscope/ms-swift docs/source_en/Instruction/Command-line-parameters.md (v3.6-v3.9): base, "
                "model, data, template, tuner, training and RLHF arguments; swift/llm/argument parse_args")
SWIFT_SUBCOMMANDS = ("sft", "pt", "rlhf")
SWIFT_KEYS = frozenset({
    "tuner_backend", "train_type", "adapters", "external_plugins", "seed", "model_kwargs", "load_args",
    "load_data_args", "use_hf", "hub_token", "custom_register_path", "ignore_args_error", "use_swift_lora",
    "model", "model_type", "model_revision", "task_type", "torch_dtype", "attn_impl", "num_labels",
    "problem_type", "rope_scaling", "device_map", "max_memory", "local_repo_path", "init_strategy",
    "dataset", "val_dataset", "split_dataset_ratio", "data_seed", "dataset_num_proc", "load_from_cache_file",
    "dataset_shuffle", "val_dataset_shuffle", "streaming", "interleave_prob", "stopping_strategy",
    "shuffle_buffer_size", "download_mode", "columns", "strict", "remove_unused_columns", "model_name",
    "model_author", "custom_dataset_info", "template", "system", "max_length", "truncation_strategy",
    "max_pixels", "agent_template", "norm_bbox", "use_chat_template", "padding_free", "padding_side",
    "loss_scale", "sequence_parallel_size", "response_prefix", "template_backend", "freeze_parameters",
    "freeze_parameters_ratio", "trainable_parameters", "freeze_llm", "freeze_vit", "freeze_aligner",
    "target_modules", "target_regex", "modules_to_save", "lora_rank", "lora_alpha", "lora_dropout", "lora_bias",
    "lora_dtype", "lorap_lr_ratio", "use_rslora", "use_dora", "lora_ga_batch_size", "init_weights",
    "output_dir", "overwrite_output_dir", "per_device_train_batch_size", "per_device_eval_batch_size",
    "gradient_accumulation_steps", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm",
    "num_train_epochs", "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_ratio", "warmup_steps",
    "logging_dir", "logging_first_step", "logging_steps", "eval_strategy", "eval_steps", "save_strategy",
    "save_steps", "save_total_limit", "save_only_model", "bf16", "fp16", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "deepspeed", "zero_hpz_partition_size", "fsdp", "fsdp_config",
    "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers", "report_to",
    "run_name", "resume_from_checkpoint", "resume_only_model", "ddp_backend", "ddp_timeout",
    "ddp_find_unused_parameters", "optim", "metric_for_best_model", "greater_is_better", "packing",
    "lazy_tokenize", "add_version", "create_checkpoint_symlink", "check_model", "acc_strategy",
    "predict_with_generate", "eval_use_evalscope", "use_liger_kernel", "average_tokens_across_devices",
    "max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "num_beams", "stream",
    "stop_words", "logprobs", "top_logprobs",
    # RLHF
    "rlhf_type", "ref_model", "ref_model_type", "reward_model", "reward_model_type", "beta", "rpo_alpha",
    "label_smoothing", "loss_type", "cpo_alpha", "simpo_gamma", "desirable_weight", "undesirable_weight",
    "num_generations", "max_completion_length", "reward_funcs", "reward_weights", "use_vllm", "vllm_mode",
    "vllm_gpu_memory_utilization", "vllm_max_model_len", "vllm_tensor_parallel_size", "vllm_server_host",
    "vllm_server_port", "num_iterations", "epsilon", "epsilon_high", "dynamic_sample", "max_resample_times",
    "sleep_level", "move_model_batches", "offload_optimizer", "offload_model", "async_generate",
    "log_completions", "scale_rewards", "steps_per_generation", "generation_batch_size",
})


def check_swift(subcommand: str, argv: list[str]) -> dict[str, str]:
    """``swift <subcommand> <argv>``'s arguments, or :class:`CliError` with swift's real failure."""
    if subcommand not in (*SWIFT_SUBCOMMANDS, "infer", "deploy", "export", "eval", "sample", "app", "web-ui"):
        raise CliError([f"ValueError: Unsupported command: {subcommand!r}"], 1)
    parsed: dict[str, str] = {}
    remaining: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if not arg.startswith("--"):
            remaining.append(arg)
            i += 1
            continue
        key, eq, value = arg[2:].partition("=")
        values: list[str] = [value] if eq else []
        j = i + 1
        while not eq and j < len(argv) and not argv[j].startswith("--"):
            values.append(argv[j])  # list-valued arguments take every value up to the next option
            j += 1
        if key in SWIFT_KEYS:
            parsed[key] = " ".join(values) if values else "true"
        else:
            remaining.extend([arg, *([] if eq else values)])
        i = j
    if remaining and parsed.get("ignore_args_error", "false").lower() not in ("true", "1"):
        raise CliError([f"ValueError: remaining_argv: {remaining}"], 1)
    return parsed


# --- VERL ------------------------------------------------------------------------------------------------
VERL_SOURCE = "volcengine/verl verl/trainer/config/ppo_trainer.yaml (v0.4-v0.6): top-level config groups"
VERL_GROUPS = frozenset({"data", "actor_rollout_ref", "critic", "reward_model", "custom_reward_function",
                         "algorithm", "trainer", "ray_init", "ray_kwargs", "global_profiler", "hydra"})


def check_verl(overrides: list[str]) -> dict[str, str]:
    """Hydra overrides of ``verl.trainer.main_ppo`` as ``dotted.key -> value``; unknown groups fail."""
    parsed: dict[str, str] = {}
    for item in overrides:
        key, eq, value = item.partition("=")
        if not eq:
            raise CliError([f"LexerNoViableAltException: {item}", "                    ^",
                            "See https://hydra.cc/docs/1.2/advanced/override_grammar/basic for details",
                            "", "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."], 1)
        appended = key.startswith("+")
        key = key.lstrip("+~")
        group = key.split(".", 1)[0]
        if not appended and group not in VERL_GROUPS:
            raise CliError([f"Could not override '{key}'.", f"To append to your config use +{key}={value}",
                            f"Key '{group}' is not in struct", f"    full_key: {group}", "    object_type=dict",
                            "", "Set the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace."], 1)
        parsed[key] = value
    return parsed


SOURCES = {"torchrun": TORCHRUN_SOURCE, "hyperpodrun": HYPERPODRUN_SOURCE, "llamafactory-cli": LLAMAFACTORY_SOURCE,
           "swift": SWIFT_SOURCE, "verl.trainer.main_ppo": VERL_SOURCE}


# --- whole commands ----------------------------------------------------------------------------------------
LAUNCHERS = ("torchrun", "hyperpodrun")
_SHELLS = ("bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash")


@dataclass(frozen=True)
class Invocation:
    """A training command as the sandbox runs it: the recipe it is (``pytorch``, ``llama-factory``,
    ``ms-swift``, ``verl``), its launcher (``torchrun``/``hyperpodrun`` or none), the launcher's options and
    the program's arguments as parsed settings (``key -> value``)."""

    recipe: str
    launcher: str = ""
    launch: Launch | None = None
    settings: dict[str, str] = field(default_factory=dict)
    config_file: str = ""  # llamafactory-cli train <yaml>


def expand(word: str, env: dict[str, str]) -> str:
    """``$VAR``, ``${VAR}`` and ``${VAR:-default}`` as the shell expands them (unset: empty)."""
    out: list[str] = []
    i = 0
    while i < len(word):
        ch = word[i]
        if ch != "$" or i + 1 >= len(word):
            out.append(ch)
            i += 1
            continue
        if word[i + 1] == "{":
            end = word.find("}", i)
            if end < 0:
                out.append(word[i:])
                break
            inner = word[i + 2:end]
            name, sep, default = inner.partition(":-")
            out.append(env.get(name) or (default if sep else ""))
            i = end + 1
            continue
        j = i + 1
        while j < len(word) and (word[j].isalnum() or word[j] == "_"):
            j += 1
        if j == i + 1:
            out.append(ch)
            i += 1
            continue
        out.append(env.get(word[i + 1:j], ""))
        i = j
    return "".join(out)


def commands(argv: list[str], env: dict[str, str]) -> list[list[str]]:
    """The simple commands a container's command line runs: itself, or the lines of a ``bash -c`` script
    (split at newlines, ``;``, ``&&`` and ``||``), each word expanded, leading ``VAR=x`` and ``exec`` dropped."""
    import shlex

    if len(argv) >= 3 and argv[0] in _SHELLS and argv[1] in ("-c", "-lc", "-ec", "-xc"):
        script = argv[2]
        try:
            lexer = shlex.shlex(script.replace("\\\n", " "), posix=True, punctuation_chars=";&|\n")
            lexer.whitespace = " \t"
            lexer.whitespace_split = True
            tokens = list(lexer)
        except ValueError:
            return []
        found: list[list[str]] = [[]]
        for token in tokens:
            if token and set(token) <= set(";&|\n"):
                found.append([])
            else:
                found[-1].append(token)
        raw = [c for c in found if c]
    else:
        raw = [list(argv)]
    result = []
    for words in raw:
        words = [expand(w, env) if "$" in w else w for w in words]
        while words and (words[0] in ("exec", "env") or _assignment(words[0])):
            words.pop(0)
        if words:
            result.append(words)
    return result


def _assignment(word: str) -> bool:
    name, eq, _ = word.partition("=")
    return bool(eq) and name.isidentifier()


def identify(argv: list[str], env: dict[str, str]) -> Invocation | None:
    """The training invocation among a container's commands (``None``: no recorded CLI runs); raises
    :class:`CliError` when the CLI would refuse its arguments."""
    for words in commands(argv, env):
        found = _identify_one(words)
        if found is not None:
            return found
    return None


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _identify_one(words: list[str]) -> Invocation | None:
    prog = _basename(words[0])
    rest = words[1:]
    if prog == "ray" and rest[:2] == ["job", "submit"] and "--" in rest:
        return _identify_one(rest[rest.index("--") + 1:]) if rest.index("--") + 1 < len(rest) else None
    if prog.startswith("python") and len(rest) >= 2 and rest[0] == "-m":
        module, rest = rest[1], rest[2:]
        if module == "torch.distributed.run":
            return _launched("torchrun", rest)
        if module == "verl.trainer.main_ppo":
            return Invocation("verl", settings=check_verl(rest))
        return None
    if prog in LAUNCHERS:
        return _launched(prog, rest)
    if prog == "llamafactory-cli":
        return _llamafactory(rest)
    if prog == "swift" and rest:
        return Invocation("ms-swift", settings=check_swift(rest[0], rest[1:]))
    return None


def _module(module: str, argv: list[str]) -> Invocation | None:
    """What ``torchrun --module <module>`` runs: what ``llamafactory-cli train <yaml>`` and ``swift <command>``
    themselves launch under torchrun (``llamafactory.launcher``, ``swift.cli.<command>``)."""
    if module == "llamafactory.launcher":
        return _llamafactory(["train", *argv])
    if module.startswith("swift.cli."):
        return Invocation("ms-swift", settings=check_swift(module.removeprefix("swift.cli."), argv))
    return None


def _launched(prog: str, argv: list[str]) -> Invocation:
    launch = parse_launcher(prog, argv)
    script = launch.script
    if "module" in launch.options and script:
        inner = _module(script[0], script[1:])
    else:
        inner = _identify_one(script) if _basename(script[0]) in ("llamafactory-cli", "swift") else None
    if inner is not None:
        return Invocation(inner.recipe, prog, launch, inner.settings, inner.config_file)
    return Invocation("pytorch", prog, launch, parse_overrides(script[1:]))


def _llamafactory(argv: list[str]) -> Invocation:
    if not argv or argv[0] not in ("train", "chat", "eval", "export", "api", "webchat", "webui", "version", "env"):
        raise CliError(["Unknown command: " + (argv[0] if argv else "") + ".",
                        "Usage: llamafactory-cli train -h: train models"], 1)
    rest = argv[1:]
    config = rest[0] if rest and rest[0].endswith((".yaml", ".yml", ".json")) else ""
    settings = parse_overrides(rest[1:] if config else rest)
    if not config:  # with a YAML, the merged keys are checked once the file is read (llamafactory_config)
        check_llamafactory(settings)
    return Invocation("llama-factory", settings=settings, config_file=config)


def check(argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The errors the real CLI would print for this command line (empty: it accepts it)."""
    try:
        identify(argv, env or {})
    except CliError as exc:
        return exc.lines
    return []
