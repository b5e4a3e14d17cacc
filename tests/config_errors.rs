//! Config errors name the file, the line, the key and what is allowed.

use std::path::Path;

use optimizerd::spec::config::{Config, DEFAULT_CONFIG};

fn parse(text: &str) -> Result<Config, String> {
    Config::parse(text, Path::new("/etc/agent.toml"), Path::new("/etc")).map_err(|e| e.to_string())
}

#[test]
fn the_embedded_file_equals_the_built_in_defaults() {
    let from_file = parse(DEFAULT_CONFIG).unwrap();
    let from_nothing = parse("").unwrap();
    assert_eq!(from_file.workload, from_nothing.workload);
    assert_eq!(from_file.timing, from_nothing.timing);
    assert_eq!(from_file.check, from_nothing.check);
    assert_eq!(from_file.worker, from_nothing.worker);
    assert_eq!(from_file.run, from_nothing.run);
    assert_eq!(from_file.baseline, from_nothing.baseline);
    assert_eq!(from_file.agent, from_nothing.agent);
    assert!(!from_file.agent.enabled(), "the agent is opt-in");
    assert_eq!(from_file.shapes().len(), 8);
}

#[test]
fn an_unknown_key_names_file_line_key_and_the_allowed_keys() {
    let err = parse("[timing]\nwarmup = 3\nwarmpu = 5\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:3:"), "{err}");
    assert!(err.contains("warmpu"), "{err}");
    assert!(err.contains("samples_per_round"), "allowed keys missing: {err}");
}

#[test]
fn an_unknown_section_is_an_error() {
    let err = parse("[timming]\nwarmup = 3\n").unwrap_err();
    assert!(err.contains("timming") && err.contains("workload"), "{err}");
}

#[test]
fn a_bad_enum_value_lists_the_allowed_values() {
    let err = parse("[workload]\ndtype = \"fp8\"\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:2:"), "{err}");
    assert!(err.contains("fp8") && err.contains("fp16") && err.contains("bf16"), "{err}");
}

#[test]
fn a_bad_head_dim_names_the_shape_and_allowed_values() {
    let err = parse("[workload]\nshapes = [ { b = 1, h = 1, s = 8, d = 96 } ]\n").unwrap_err();
    assert!(err.contains("workload.shapes[0].d") && err.contains("[64, 128]"), "{err}");
}

#[test]
fn a_bad_duration_says_how_to_write_one() {
    let err = parse("[worker]\ncheck_timeout = \"two minutes\"\n").unwrap_err();
    assert!(err.contains("/etc/agent.toml:2:") && err.contains("\"5m\""), "{err}");
}

#[test]
fn a_zero_or_out_of_range_value_is_rejected_with_its_key() {
    let err = parse("[timing]\nrounds = 0\n").unwrap_err();
    assert!(err.contains("timing.rounds") && err.contains("at least 1"), "{err}");
    let err = parse("[timing]\nmin_gain = 1.5\n").unwrap_err();
    assert!(err.contains("timing.min_gain") && err.contains("0 <= min_gain < 1"), "{err}");
}

#[test]
fn a_missing_file_names_the_path() {
    let err = Config::load_file(Path::new("/nonexistent/agent.toml")).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/agent.toml"), "{err}");
}

#[test]
fn a_partial_file_keeps_defaults_for_the_rest() {
    let c = parse("[timing]\nrounds = 9\n").unwrap();
    assert_eq!(c.timing.rounds, 9);
    assert_eq!(c.timing.samples_per_round, 10);
    assert_eq!(c.workload.shapes.len(), 8);
}

#[test]
fn agent_keys_are_checked_with_file_line_and_key() {
    let err = parse("[agent]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\ntemperature = 3.0\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:4:") && err.contains("agent.temperature") && err.contains("0 ..= 2"), "{err}");
    let err = parse("[agent]\nbase_url = \"127.0.0.1:9\"\nmodel = \"m\"\n").unwrap_err();
    assert!(err.contains(":2:") && err.contains("agent.base_url"), "{err}");
    let err = parse("[agent]\nbase_url = \"http://x/v1\"\n").unwrap_err();
    assert!(err.contains("agent.model"), "{err}");
    let err = parse("[agent]\napi_key_env = \"sk-123 secret\"\n").unwrap_err();
    assert!(err.contains("agent.api_key_env") && err.contains("environment variable"), "{err}");
    let err = parse("[agent]\nbase_url = \"http://x/v1\"\nmodell = \"m\"\n").unwrap_err();
    assert!(err.starts_with("/etc/agent.toml:3:") && err.contains("modell"), "{err}");
    let ok = parse("[agent]\nbase_url = \"http://127.0.0.1:8000/v1\"\nmodel = \"qwen\"\nusd_per_mtok_prompt = 2.0\nusd_per_mtok_completion = 8.0\n").unwrap();
    assert!(ok.agent.enabled());
    assert!((ok.agent.cost(1_000_000, 500_000) - 6.0).abs() < 1e-9);
}
