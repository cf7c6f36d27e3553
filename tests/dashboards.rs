//! dashboards/: the Prometheus config and alert rules pass promtool (including the rule
//! unit tests), and every metric the Grafana dashboard queries exists in a live scrape.
mod common;

use std::collections::BTreeSet;
use std::process::Command;

fn dashboards() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool").args(args).current_dir(dashboards().join("prometheus")).output().expect("promtool");
    assert!(out.status.success(), "promtool {args:?}:\n{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

#[test]
fn prometheus_config_and_alert_rules_pass_promtool() {
    promtool(&["check", "config", "prometheus.yml"]);
    promtool(&["check", "rules", "alerts.yml"]);
    promtool(&["test", "rules", "alerts_test.yml"]);
    promtool(&["check", "rules", "mlx_flash_compat.yml"]);
    promtool(&["test", "rules", "mlx_flash_compat_test.yml"]);
}

/// `mlxbar_…` names in a PromQL expression, histogram suffixes stripped.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = expr;
    while let Some(i) = rest.find("mlxbar_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let name = &tail[..end];
        out.push(name.trim_end_matches("_bucket").to_string());
        rest = &tail[end..];
    }
    out
}

#[tokio::test]
async fn every_dashboard_query_names_an_exported_metric() {
    let text = std::fs::read_to_string(dashboards().join("grafana/mlxbar.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut wanted = BTreeSet::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            wanted.extend(metric_names(t["expr"].as_str().unwrap()));
        }
    }
    assert!(wanted.len() > 20, "{wanted:?}");
    // HTTP series exist once a request was answered; model series from the start.
    reqwest::get(format!("{}/v1/models", common::server())).await.unwrap();
    let scrape = reqwest::get(format!("{}/metrics", common::server())).await.unwrap().text().await.unwrap();
    let exported: BTreeSet<String> =
        scrape.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap().to_string()).collect();
    // A streamed model's series exist only while one streams (tests/expert_streaming.rs
    // checks those against its own scrape), a cluster's per-rank series only on its rank 0
    // (tests/cluster.rs); power series only where the machine reads them.
    let elsewhere = |m: &str| m.starts_with("mlxbar_expert_") || m.starts_with("mlxbar_cluster_rank_") || WHERE_READABLE.contains(&m);
    let missing: Vec<_> = wanted.difference(&exported).filter(|m| !elsewhere(m)).collect();
    assert!(missing.is_empty(), "queried but not exported: {missing:?}");
    for m in WHERE_READABLE {
        assert!(wanted.contains(m), "the dashboard has no panel for {m}");
    }
    // the dashboard covers many Macs through its instance variable
    assert!(text.contains("label_values(mlxbar_info, instance)"));
}

/// Series with no sample where this machine cannot read the figure (`mlxbar_power_available`
/// says which): the dashboard queries them; a Linux build machine without RAPL exports none.
const WHERE_READABLE: [&str; 9] = [
    "mlxbar_gpu_busy_ratio",
    "mlxbar_gpu_frequency_hertz",
    "mlxbar_power_watts",
    "mlxbar_energy_joules_total",
    "mlxbar_temperature_celsius",
    "mlxbar_thermal_pressure",
    "mlxbar_generation_joules_total",
    "mlxbar_generation_tokens_per_joule",
    "mlxbar_idle_power_watts",
];

#[tokio::test]
async fn every_exported_metric_is_documented() {
    reqwest::get(format!("{}/v1/models", common::server())).await.unwrap();
    let scrape = reqwest::get(format!("{}/metrics", common::server())).await.unwrap().text().await.unwrap();
    let readme = std::fs::read_to_string(dashboards().join("README.md")).unwrap();
    let families: Vec<&str> = scrape.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()).collect();
    assert!(families.len() > 40, "{families:?}");
    let undocumented: Vec<_> =
        families.iter().copied().chain(WHERE_READABLE).filter(|name| !readme.contains(&format!("| `{name}` |"))).collect();
    assert!(undocumented.is_empty(), "exported but without a row in dashboards/README.md: {undocumented:?}");
}

#[test]
fn prometheus_alert_rules_are_the_built_in_defaults() {
    let committed = std::fs::read_to_string(dashboards().join("prometheus/alerts.yml")).unwrap();
    let generated = mlxbar::alerts::rules::prometheus_rules(&mlxbar::alerts::rules::defaults());
    assert!(
        committed == generated,
        "dashboards/prometheus/alerts.yml is stale: run `mlxbar alerts prometheus-rules > dashboards/prometheus/alerts.yml`"
    );
}
