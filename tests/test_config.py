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


def test_training_temperature_must_match_sampling_temperature():
    with pytest.raises(ConfigError, match=r"actor\.temperature=1\.0 differs from gconfig\.temperature=0\.7; set actor\.temperature=0\.7"):
        load_config(["gconfig.temperature=0.7"], GRPOConfig)
    cfg = load_config(["gconfig.temperature=0.7", "actor.temperature=0.7"], GRPOConfig)
    assert cfg.actor.temperature == 0.7
    assert load_config(["gconfig.temperature=0.0"], GRPOConfig).gconfig.temperature == 0.0  # greedy: nothing to match
