//! The Prometheus rules agree with the in-app alert engine. The scenarios of
//! src/alerts/scenarios.rs run through the app's engine; whether it fires, and with what
//! value, at every second becomes a promtool test of the generated rules
//! (src/alerts/promtool.rs), which promtool must pass. The checked-in dashboards/prometheus/alerts_test.yml is that file
//! (`UPDATE_ALERT_TESTS=1` rewrites it). promtool must be on PATH (scripts/test.sh
//! installs it): without it this fails rather than skips.
use std::path::Path;
use std::process::Command;

use mlxbar::alerts::{promtool, rules, scenarios};

/// Runs `promtool test rules` on `tests` against `rules_file` in a scratch directory.
fn promtool_test(rules_file: &str, tests: &str) -> (bool, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("alerts.yml"), rules_file).unwrap();
    std::fs::write(dir.path().join("alerts_test.yml"), tests).unwrap();
    let out = Command::new("promtool")
        .args(["test", "rules", "alerts_test.yml"])
        .current_dir(dir.path())
        .output()
        .expect("promtool is not on PATH (apt-get install prometheus, or brew install prometheus)");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

#[test]
fn prometheus_fires_and_resolves_the_generated_rules_when_the_app_does() {
    let defaults = rules::defaults();
    let rules_file = rules::prometheus_rules(&defaults);
    let every_second = promtool::rule_tests(&defaults, &scenarios::all(), true);
    let (ok, out) = promtool_test(&rules_file, &every_second);
    assert!(ok, "promtool disagrees with the app's alert engine:\n{out}");
    let tests = promtool::rule_tests(&defaults, &scenarios::all(), false);
    let (ok, out) = promtool_test(&rules_file, &tests);
    assert!(ok, "{out}");

    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/prometheus/alerts_test.yml");
    if std::env::var_os("UPDATE_ALERT_TESTS").is_some() {
        std::fs::write(&committed, &tests).unwrap();
    }
    let text = std::fs::read_to_string(&committed).unwrap();
    assert!(text == tests, "dashboards/prometheus/alerts_test.yml is stale: rerun with UPDATE_ALERT_TESTS=1");
}

#[test]
fn the_check_catches_rules_that_differ_from_the_app() {
    let defaults = rules::defaults();
    let tests = promtool::rule_tests(&defaults, &scenarios::all(), false);
    // without the 30 s recovery, Prometheus resolves as soon as the value drops
    let mut hasty = defaults.clone();
    for r in &mut hasty {
        r.recover_seconds = 0.0;
    }
    let (ok, out) = promtool_test(&rules::prometheus_rules(&hasty), &tests);
    assert!(!ok && out.contains("MlxbarQueueBacklog"), "{out}");
    // the bugs this check was written for: swap growth as the change over the window (not
    // the rise above its low) misses the climb; all refusals counted fires on a bench run's
    for (good, bad, alert) in [
        (
            "mlxbar_swap_used_bytes - min_over_time(mlxbar_swap_used_bytes[300s])",
            "delta(mlxbar_swap_used_bytes[300s])",
            "MlxbarSwapGrowing",
        ),
        ("mlxbar_admission_refused_total{reason=\"memory_pressure\"}", "mlxbar_admission_refused_total", "MlxbarAdmissionHeld"),
    ] {
        let right = rules::prometheus_rules(&defaults);
        assert!(right.contains(good), "{good}");
        let (ok, out) = promtool_test(&right.replace(good, bad), &tests);
        assert!(!ok && out.contains(alert), "{bad}: {out}");
    }
}
