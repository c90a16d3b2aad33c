import pytest

from arealite.config import ConfigError, GRPOConfig, OptimizerConfig, load_config, save_config


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return str(p)


def test_yaml_and_overrides_make_real_dataclasses(tmp_path):
    path = write(tmp_path, "actor:\n  path: /m\n  optimizer:\n    lr: 0.001\ngconfig:\n  group_size: 8\n")
    cfg = load_config(["--config", path, "gconfig.max_new_tokens=7", "actor.optimizer.lr=0.5"], GRPOConfig)
    assert isinstance(cfg, GRPOConfig) and isinstance(cfg.actor.optimizer, OptimizerConfig)
    assert cfg.actor.path == "/m" and cfg.gconfig.group_size == 8 and cfg.gconfig.max_new_tokens == 7
    assert cfg.actor.optimizer.lr == 0.5  # override beats the file
    assert cfg.run_dir.endswith("arealite/trial0")


def test_unknown_key_names_dotted_path_and_close_match(tmp_path):
    with pytest.raises(ConfigError, match=r"'actor\.optimizer\.lrr'.*actor\.optimizer\.lr"):
        load_config(["actor.optimizer.lrr=1"], GRPOConfig)
    path = write(tmp_path, "gconfg:\n  group_size: 2\n")
    with pytest.raises(ConfigError, match=r"'gconfg'.*did you mean gconfig"):
        load_config(["--config", path], GRPOConfig)


def test_wrong_type_names_field_and_expected_type():
    with pytest.raises(ConfigError, match=r"'gconfig\.group_size' expects int"):
        load_config(["gconfig.group_size=many"], GRPOConfig)
    with pytest.raises(ConfigError, match=r"'actor\.optimizer\.lr' expects float"):
        load_config(["actor.optimizer.lr=fast"], GRPOConfig)


def test_value_validation_says_what_to_set():
    with pytest.raises(ConfigError, match=r"lr_scheduler_type='cosin'.*cosine"):
        load_config(["actor.optimizer.lr_scheduler_type=cosin"], GRPOConfig)
    with pytest.raises(ConfigError, match=r"weight_keep_versions=0 must be > 0"):
        load_config(["weight_keep_versions=0"], GRPOConfig)
    with pytest.raises(ConfigError, match=r"top_p=1.5"):
        load_config(["gconfig.top_p=1.5"], GRPOConfig)


def test_bad_arguments_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(["--config", str(tmp_path / "nope.yaml")], GRPOConfig)
    with pytest.raises(ConfigError, match="cannot parse argument"):
        load_config(["--lr", "3"], GRPOConfig)
    with pytest.raises(ConfigError, match="cannot parse config file"):
        load_config(["--config", write(tmp_path, "a: [1\n")], GRPOConfig)


def test_optional_sub_config_and_roundtrip(tmp_path):
    cfg = load_config(["ref.path=/ref", "seed=5"], GRPOConfig)
    assert cfg.ref is not None and cfg.ref.path == "/ref"
    out = tmp_path / "run" / "config.yaml"
    save_config(cfg, str(out))
    again = load_config(["--config", str(out)], GRPOConfig)
    assert again == cfg


def test_sampling_facts_are_stated_once_in_gconfig():
    # group size, temperature and budget live only in gconfig; the trainer reads them from there
    cfg = load_config(["gconfig.temperature=0.7", "gconfig.group_size=3"], GRPOConfig)
    assert cfg.gconfig.logprob_temperature == 0.7 and cfg.gconfig.group_size == 3
    assert not any(hasattr(cfg.actor, k) for k in ("group_size", "temperature", "max_new_tokens", "adv_norm"))
    greedy = load_config(["gconfig.temperature=0.0"], GRPOConfig).gconfig
    assert greedy.logprob_temperature == 1.0  # servers report temperature-1 logprobs for greedy samples


@pytest.mark.parametrize(
    "override, new",
    [
        ("actor.group_size=8", "gconfig.group_size"),
        ("actor.temperature=0.7", "gconfig.temperature"),
        ("actor.max_new_tokens=16", "gconfig.max_new_tokens"),
        ("actor.adv_norm=group_baseline_batch", "group_baseline_batch -> group_norm=mean whiten_advantages=true"),
    ],
)
def test_removed_keys_fail_naming_the_new_spelling(tmp_path, override, new):
    with pytest.raises(ConfigError, match=f"config key '{override.split('=')[0]}' was removed: .*{new}"):
        load_config([override], GRPOConfig)
    key, value = override.split("=")
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"'{key}' was removed"):  # in a YAML file too
        load_config(["--config", write(tmp_path, f"{section}:\n  {name}: {value}\n")], GRPOConfig)


def test_the_renamed_keys_leave_when_0_2_0_is_cut():
    import re
    from pathlib import Path

    from arealite.config.loading import RENAMED

    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    major, minor = (int(part) for part in re.search(r'^version = "(\d+)\.(\d+)', pyproject, re.M).groups())
    if (major, minor) >= (0, 2):
        assert not RENAMED, "0.2.0 drops the renamed-key table (docs/CHANGELOG.md): empty RENAMED"
    else:
        assert RENAMED  # the 0.1.x configs still get the new spelling


def test_every_config_field_has_help_text():
    import dataclasses
    import typing

    from arealite.config.help import field_help

    missing, seen, todo = [], set(), [GRPOConfig]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for name, text in field_help(cls).items():
            if not text:
                missing.append(f"{cls.__name__}.{name}")
        for tp in typing.get_type_hints(cls).values():
            todo += [a for a in typing.get_args(tp) or (tp,) if isinstance(a, type) and dataclasses.is_dataclass(a)]
    assert len(seen) > 10, sorted(c.__name__ for c in seen)  # the walk reached the nested sections
    assert not missing, f"fields without help text (setting(default, help)): {missing}"


def test_help_prints_every_field_with_default_and_help_and_exits_zero(capsys):
    from arealite.config.help import leaf_fields

    with pytest.raises(SystemExit) as exit_info:
        load_config(["--config", "does-not-matter.yaml", "--help"], GRPOConfig)
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    rows = leaf_fields(GRPOConfig)
    assert len(rows) > 100
    for name, tp, default, help_text in rows:
        assert f"  {name}: {tp} = {default!r}\n      {help_text}\n" in out, name
    assert "  gconfig.group_size: int = 4\n      samples per prompt" in out


def test_field_help_reads_field_metadata_and_help_shows_the_choices():
    import dataclasses
    from typing import Literal

    from arealite.config import setting
    from arealite.config.help import config_help, field_help

    @dataclasses.dataclass
    class Demo:
        a: int = setting(1, "first")
        c: list[int] = setting(factory=list, help="a mutable default")
        d: float = 0.0
        e: Literal["x", "y"] = setting("x", "a choice")

    assert field_help(Demo) == {"a": "first", "c": "a mutable default", "d": "", "e": "a choice"}
    assert Demo().c == [] and Demo().c is not Demo().c
    assert "  e: Literal['x', 'y'] = 'x'\n      a choice\n" in config_help(Demo)


def test_choices_are_declared_once_where_the_library_keeps_a_table():
    import typing

    from arealite.algo.advantages import GROUP_NORM_MODES, GROUP_STDS
    from arealite.algo.losses import AGGREGATIONS, KL_ESTIMATORS, OBJECTIVES
    from arealite.config import GroupNorm, GroupStd, KlEstimator, LossAggMode, PauseMode, PolicyLoss, WeightUpdateMode
    from arealite.server.control import PAUSE_MODES
    from arealite.weight_sync.sync import MODES

    assert set(typing.get_args(LossAggMode)) == set(AGGREGATIONS)
    assert set(typing.get_args(KlEstimator)) == set(KL_ESTIMATORS)
    assert set(typing.get_args(PolicyLoss)) == set(OBJECTIVES)
    assert typing.get_args(WeightUpdateMode) == MODES
    assert set(typing.get_args(GroupNorm)) == {*GROUP_NORM_MODES, "none"}
    assert set(typing.get_args(GroupStd)) == set(GROUP_STDS)
    assert set(typing.get_args(PauseMode)) == set(PAUSE_MODES)  # the server's own list (it imports no config)


def test_help_on_the_example_and_through_the_launchers_exits_zero():
    import subprocess
    import sys
    from pathlib import Path

    from arealite.launcher.process import with_package_path

    repo = Path(__file__).resolve().parents[1]
    script = "examples/gsm8k_grpo.py"
    commands = {
        "example": [sys.executable, script, "--help"],
        "local, after SCRIPT": [sys.executable, "-m", "arealite.launcher.local", script,
                                "--config", "configs/tiny_cpu.yaml", "--help"],
        "slurm, after SCRIPT": [sys.executable, "-m", "arealite.launcher.slurm", script, "-h"],
        "local, before SCRIPT": [sys.executable, "-m", "arealite.launcher.local", "--help"],
    }  # fmt: skip
    for what, cmd in commands.items():
        env = with_package_path(None)  # the script's own directory, not the repository, heads sys.path
        proc = subprocess.run(cmd, cwd=repo, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, (what, proc.stderr[-2000:])
        if "before" in what:
            assert proc.stdout.startswith("usage: python -m arealite.launcher.local") and "SCRIPT --help" in proc.stdout
        else:
            assert "  gconfig.group_size: int = 4\n      samples per prompt" in proc.stdout, what
            assert "  actor.group_norm: Literal['mean_std', 'mean', 'rloo', 'none'] = 'mean_std'" in proc.stdout, what


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ref.path=/m", "ref.dtype=float16"], "ref.dtype='float16' is not supported"),
        (["critic.dtype=x"], "critic.dtype='x' is not supported"),
        (["valid_dataset.type=bad"], "valid_dataset.type='bad' is not supported"),
        (["actor.mb_spec.n_mbs=0"], "actor.mb_spec.n_mbs=0 must be > 0"),
        (["actor.dtype=x"], "actor.dtype='x' is not supported"),
        (["weight_update=bad"], "weight_update='bad' is not supported"),
    ],
)
def test_validation_errors_name_the_key_the_user_wrote(overrides, message):
    # a section class validates itself under one name; the error names the section actually set
    with pytest.raises(ConfigError) as info:
        load_config(overrides, GRPOConfig)
    assert str(info.value).startswith(message), str(info.value)


def test_the_experiment_seed_fills_every_unset_seed():
    from arealite.config import GenerationHyperparameters, LoRAConfig, PPOActorConfig, PPOCriticConfig

    config = GRPOConfig(seed=5, critic=PPOCriticConfig(), actor=PPOActorConfig(lora=LoRAConfig()), weight_update="lora")
    assert (config.critic.seed, config.actor.lora.seed, config.gconfig.sampling_seed) == (5, 5, 5)
    own = GRPOConfig(seed=5, critic=PPOCriticConfig(seed=2), gconfig=GenerationHyperparameters(sampling_seed=7))
    assert (own.critic.seed, own.gconfig.sampling_seed) == (2, 7)


def test_lockstep_schedule_names_what_it_needs():
    from arealite.config import InferenceEngineConfig

    with pytest.raises(ConfigError, match=r"max_head_offpolicyness >= 1 .* got 0"):
        InferenceEngineConfig(schedule="lockstep")
    with pytest.raises(ConfigError, match="dynamic_sampling=false"):
        InferenceEngineConfig(schedule="lockstep", max_head_offpolicyness=1, dynamic_sampling=True)
    assert InferenceEngineConfig(schedule="lockstep", max_head_offpolicyness=1).schedule == "lockstep"


def test_readers_of_the_shared_sections_leave_a_scripts_own_sections_out(tmp_path):
    """`script_sections=True` (launchers, replay) drops top-level sections GRPOConfig lacks, from the
    file and the overrides, and still checks everything else."""
    path = write(tmp_path, "seed: 3\nmy_script:\n  knob: 1\nactor:\n  path: /m\n")
    cfg = load_config(["--config", path, "my_script.other=2"], GRPOConfig, script_sections=True)
    assert cfg.seed == 3 and cfg.actor.path == "/m"
    with pytest.raises(ConfigError, match="unknown config key 'my_script'"):
        load_config(["--config", path], GRPOConfig)
    with pytest.raises(ConfigError, match="unknown config key 'seeed'"):
        load_config(["--config", path, "seeed=4"], GRPOConfig, script_sections=True)  # a key, not a section
    with pytest.raises(ConfigError, match="unknown config key 'actor.pth'"):
        load_config(["--config", path, "actor.pth=/x"], GRPOConfig, script_sections=True)
