//! A run as people read it: a Markdown table (printed by the CLI, pasted in the README)
//! and a self-contained HTML report with charts of tok/s and TTFT per cell. Tokens per
//! joule stand beside tokens per second ("unavailable" where the machine reads no power).
//! A run with predicted cells (edit plans) adds four columns: how the server took the
//! `prediction`, its accepted and rejected tokens, and the speed-up over no prediction.
use plotters::prelude::*;

use super::record::{CellResult, RunRecord};

/// Markdown table; with several targets, ratio columns compare each row with the first
/// target on the same cell.
pub fn markdown(record: &RunRecord) -> String {
    let compare = record.targets.len() > 1;
    let predicted = has_predicted_cells(record);
    let mut out = String::from(
        "| cell (streams×prompt→output) | server | aggregate tok/s | tok/J | prefill J/tok | decode J/tok | per-stream tok/s | TTFT p50 | TTFT p90 | ITL p50 | ITL p90 | e2e p50 | errors |",
    );
    if predicted {
        out += &PREDICTION_HEADERS.map(|h| format!(" {h} |")).concat();
    }
    out += if compare { " aggregate × vs first | tok/J × vs first |\n" } else { "\n" };
    out += &"|---".repeat(13 + if predicted { PREDICTION_HEADERS.len() } else { 0 } + if compare { 2 } else { 0 });
    out += "|\n";
    for c in &record.cells {
        out += &format!(
            "| {} | {} | {:.1} | {} | {} | {} | {:.1} | {} | {} | {} | {} | {} | {} |",
            c.cell.spec().label(),
            c.target,
            c.aggregate_tok_s,
            energy(c.tokens_per_joule),
            energy(c.prefill_joules_per_token),
            energy(c.decode_joules_per_token),
            c.stream_tok_s_p50,
            secs(c.ttft_p50),
            secs(c.ttft_p90),
            ms(c.itl_p50),
            ms(c.itl_p90),
            secs(c.e2e_p50),
            c.errors
        );
        if predicted {
            out += &prediction_columns(c).map(|v| format!(" {v} |")).concat();
        }
        if compare {
            let base = base_of(record, c);
            let tpj = match (c.tokens_per_joule, base.tokens_per_joule) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "unavailable".into(),
            };
            out += &format!(" {:.2} | {tpj} |", c.aggregate_tok_s / base.aggregate_tok_s.max(1e-9));
        }
        out += "\n";
    }
    out
}

/// Columns of runs with predicted cells (edit plans).
const PREDICTION_HEADERS: [&str; 4] = ["prediction", "accepted pred. tok", "rejected pred. tok", "× vs no prediction (e2e)"];

fn has_predicted_cells(record: &RunRecord) -> bool {
    record.plan.cells().iter().any(|c| c.prediction) || record.cells.iter().any(|c| c.cell.prediction)
}

/// A row's [`PREDICTION_HEADERS`] figures: "–" on a cell that sent no prediction, "not
/// reported" where the server sent no counts.
fn prediction_columns(c: &CellResult) -> [String; 4] {
    if !c.cell.prediction {
        return ["none".into(), "–".into(), "–".into(), "–".into()];
    }
    let count = |n: Option<usize>| n.map_or_else(|| "not reported".into(), |n| n.to_string());
    [
        c.prediction_use.map_or("–", |p| p.describe()).into(),
        count(c.accepted_prediction_tokens),
        count(c.rejected_prediction_tokens),
        c.prediction_speedup.map_or_else(|| "–".into(), |x| format!("{x:.2}")),
    ]
}

/// The first target's result for the same cell.
fn base_of<'a>(record: &'a RunRecord, c: &'a CellResult) -> &'a CellResult {
    record.cells.iter().find(|b| b.cell == c.cell).unwrap_or(c)
}

/// An energy figure, or "unavailable" where this machine has no power source (never 0).
fn energy(v: Option<f64>) -> String {
    v.map_or_else(|| "unavailable".into(), |v| format!("{v:.3}"))
}

fn secs(s: f64) -> String {
    format!("{s:.2} s")
}

fn ms(s: f64) -> String {
    format!("{:.0} ms", s * 1e3)
}

/// The HTML report's template, autoescaped as HTML (its name ends in .html).
const TEMPLATE: &str = include_str!("report.html");

const HTML_HEADERS: [&str; 16] = [
    "cell",
    "server",
    "aggregate tok/s",
    "tok/J",
    "prefill J/tok",
    "decode J/tok",
    "per-stream tok/s",
    "TTFT p50",
    "TTFT p90",
    "ITL p50",
    "ITL p90",
    "e2e p50",
    "prompt tok/s",
    "peak MLX",
    "pressure",
    "errors",
];

/// Self-contained HTML: run facts, two charts, the full table.
pub fn html(record: &RunRecord) -> String {
    use minijinja::{context, AutoEscape, Environment, Value};
    let mut env = Environment::new();
    env.set_auto_escape_callback(|name| if name.ends_with(".html") { AutoEscape::Html } else { AutoEscape::None });
    env.add_template("report.html", TEMPLATE).expect("the report template parses");
    let m = &record.machine;
    let targets: Vec<Value> = record
        .targets
        .iter()
        .map(|t| context! { label => t.label, url => t.url, model => t.model_id.as_deref().unwrap_or(&t.model) })
        .collect();
    let predicted = has_predicted_cells(record);
    let mut headers = HTML_HEADERS.to_vec();
    if predicted {
        headers.extend(PREDICTION_HEADERS);
    }
    let rows: Vec<Vec<String>> = record
        .cells
        .iter()
        .map(|c| {
            let mut row = vec![
                c.cell.spec().label(),
                c.target.clone(),
                format!("{:.1}", c.aggregate_tok_s),
                energy(c.tokens_per_joule),
                energy(c.prefill_joules_per_token),
                energy(c.decode_joules_per_token),
                format!("{:.1}", c.stream_tok_s_p50),
                secs(c.ttft_p50),
                secs(c.ttft_p90),
                ms(c.itl_p50),
                ms(c.itl_p90),
                secs(c.e2e_p50),
                format!("{:.0}", c.prompt_tok_s_p50),
                c.peak_mlx_bytes.map(|b| format!("{:.0} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "–".into()),
                c.pressure_max.clone().unwrap_or_else(|| "–".into()),
                c.errors.to_string(),
            ];
            if predicted {
                row.extend(prediction_columns(c));
            }
            row
        })
        .collect();
    // plotters escapes the text it puts in the SVG, so the charts go in as markup.
    let charts = [chart(record, "aggregate tok/s per cell", |c| c.aggregate_tok_s), chart(record, "TTFT p50 per cell (s)", |c| c.ttft_p50)]
        .map(Value::from_safe_string);
    let ctx = context! {
        id => record.id,
        profile => record.profile,
        state => format!("{:?}", record.state),
        version => record.mlxbar_version,
        machine => context! { chip => m.chip, cores => m.cores, os => m.os, arch => m.arch },
        memory_gib => format!("{:.0}", m.memory_bytes as f64 / (1u64 << 30) as f64),
        targets,
        charts,
        headers,
        rows,
    };
    env.get_template("report.html").and_then(|t| t.render(ctx)).expect("the report template renders")
}

const COLORS: [RGBColor; 4] =
    [RGBColor(0x1f, 0x77, 0xb4), RGBColor(0xff, 0x7f, 0x0e), RGBColor(0x2c, 0xa0, 0x2c), RGBColor(0xd6, 0x27, 0x28)];

/// One line per target over the cells in plan order, as inline SVG.
fn chart(record: &RunRecord, title: &str, value: impl Fn(&CellResult) -> f64) -> String {
    let cells = record.plan.cells();
    let top = record.cells.iter().map(&value).fold(0.0f64, f64::max).max(1e-6) * 1.15;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 300)).into_drawing_area();
        let drawn: Result<(), Box<dyn std::error::Error>> = (|| {
            root.fill(&WHITE)?;
            let n = cells.len().max(1) as f64;
            let mut chart = ChartBuilder::on(&root)
                .caption(title, ("sans-serif", 16))
                .margin(12)
                .x_label_area_size(34)
                .y_label_area_size(48)
                .build_cartesian_2d(-0.5..n - 0.5, 0.0..top)?;
            let label = |x: &f64| {
                let i = x.round();
                if (x - i).abs() > 1e-6 || i < 0.0 {
                    return String::new();
                }
                cells.get(i as usize).map(|c| c.label()).unwrap_or_default()
            };
            chart.configure_mesh().x_labels(cells.len().min(12) * 2 + 1).x_label_formatter(&label).disable_x_mesh().draw()?;
            for (i, t) in record.targets.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let points: Vec<(f64, f64)> = cells
                    .iter()
                    .enumerate()
                    .filter_map(|(x, spec)| {
                        record.cells.iter().find(|c| c.target == t.label && c.cell.spec() == *spec).map(|c| (x as f64, value(c)))
                    })
                    .collect();
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                    .label(t.label.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2)));
                chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
            }
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK.mix(0.3)).draw()?;
            root.present()?;
            Ok(())
        })();
        if let Err(e) = drawn {
            tracing::warn!("bench chart: {e}");
        }
    }
    svg
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::machine::Machine;
    use crate::bench::plan::Plan;
    use crate::bench::record::{PredictionUse, RunState, TargetInfo};

    fn run() -> RunRecord {
        let plan = Plan { concurrency: vec![1, 4], ..Plan::builtins().remove(0) };
        let target = |label: &str| TargetInfo {
            label: label.into(),
            url: "http://127.0.0.1:1".into(),
            model: "default".into(),
            model_id: None,
            mlxbar: None,
        };
        let mut cells = vec![];
        for spec in plan.cells() {
            for (label, tok) in [("mlxbar", 40.0), ("<peer>", 20.0)] {
                cells.push(CellResult {
                    target: label.into(),
                    cell: spec.into(),
                    aggregate_tok_s: tok * spec.concurrency as f64,
                    ttft_p90: 1.0,
                    ..Default::default()
                });
            }
        }
        RunRecord {
            id: "r1".into(),
            profile: "quick".into(),
            plan,
            state: RunState::Done,
            started_unix: 0,
            finished_unix: Some(1),
            mlxbar_version: "0.1.0".into(),
            machine: Machine::default(),
            targets: vec![target("mlxbar"), target("<peer>")],
            cells,
            error: None,
        }
    }

    #[test]
    fn markdown_has_ratios_against_the_first_target() {
        let md = markdown(&run());
        assert!(md.contains("| 4×128→64 | <peer> | 80.0 |"), "{md}");
        assert!(md.lines().filter(|l| l.contains("<peer>")).all(|l| l.ends_with("| 0.50 | unavailable |")), "{md}");
        assert!(md.contains("| 80.0 | unavailable | unavailable | unavailable |"), "no power source: said, not 0 {md}");
    }

    #[test]
    fn markdown_puts_both_servers_tokens_per_joule_side_by_side() {
        let mut r = run();
        for c in &mut r.cells {
            let mlxbar = c.target == "mlxbar";
            c.tokens_per_joule = Some(if mlxbar { 2.0 } else { 1.5 });
            c.prefill_joules_per_token = Some(0.01);
            c.decode_joules_per_token = Some(if mlxbar { 0.5 } else { 0.6 });
        }
        let md = markdown(&r);
        assert!(md.contains("| 4×128→64 | mlxbar | 160.0 | 2.000 | 0.010 | 0.500 |"), "{md}");
        assert!(md.lines().filter(|l| l.contains("<peer>")).all(|l| l.ends_with("| 0.50 | 0.75 |")), "{md}");
    }

    #[test]
    fn html_has_escaped_labels_and_both_charts() {
        let html = html(&run());
        assert!(!html.contains("<peer>") && html.contains("&lt;peer&gt;"));
        assert_eq!(html.matches("<svg").count(), 2);
        assert!(html.contains("4×128→64"), "cell labels on the x axis");
        assert!(html.contains("<td>4×128→64</td><td>&lt;peer&gt;</td><td>80.0</td><td>unavailable</td>"), "{html}");
    }

    #[test]
    fn a_remote_targets_script_comes_out_as_text() {
        // A peer names itself and its model, and reports its own pressure level.
        let mut r = run();
        let evil = "<script>alert(1)</script>";
        r.targets[1].label = evil.into();
        r.targets[1].model_id = Some(format!("m{evil}"));
        for c in r.cells.iter_mut().filter(|c| c.target == "<peer>") {
            c.target = evil.into();
            c.pressure_max = Some(evil.into());
        }
        r.machine.os = evil.into();
        let html = html(&r);
        assert!(!html.contains("<script"), "{html}");
        assert!(html.contains("<b>&lt;script&gt;alert(1)&lt;&#x2f;script&gt;</b>"), "{html}");
        assert!(html.contains("(model m&lt;script&gt;"), "{html}");
        assert!(html.matches("<td>&lt;script&gt;").count() >= 2 * r.plan.cells().len(), "server and pressure cells: {html}");
    }

    /// An edit run on two targets: mlxbar counts the prediction and gets faster, the peer
    /// ignores it.
    fn edit_run() -> RunRecord {
        let mut r = run();
        r.plan = Plan::builtins().into_iter().find(|p| p.name == "edit").unwrap();
        r.profile = "edit".into();
        r.cells.clear();
        for spec in r.plan.cells() {
            for label in ["mlxbar", "<peer>"] {
                let counted = spec.prediction && label == "mlxbar";
                r.cells.push(CellResult {
                    target: label.into(),
                    cell: spec.into(),
                    stream_tok_s_p50: if counted { 120.0 } else { 60.0 },
                    e2e_p50: if counted { 3.0 } else { 6.0 },
                    prediction_use: spec.prediction.then_some(if counted { PredictionUse::Counted } else { PredictionUse::Uncounted }),
                    accepted_prediction_tokens: counted.then_some(400),
                    rejected_prediction_tokens: counted.then_some(12),
                    prediction_speedup: spec.prediction.then_some(if counted { 2.0 } else { 1.0 }),
                    ..Default::default()
                });
            }
        }
        r
    }

    #[test]
    fn edit_runs_show_both_rows_with_counts_and_speed_up() {
        let md = markdown(&edit_run());
        let header = md.lines().next().unwrap();
        assert!(header.ends_with("| errors | prediction | accepted pred. tok | rejected pred. tok | × vs no prediction (e2e) | aggregate × vs first | tok/J × vs first |"), "{md}");
        assert_eq!(md.lines().nth(1).unwrap().matches("|---").count(), header.matches('|').count() - 1, "{md}");
        let row = |label: &str| md.lines().find(|l| l.starts_with(&format!("| {label} "))).unwrap_or_else(|| panic!("{label}: {md}"));
        let p = crate::bench::edit::PROMPT_TOKENS;
        assert!(row(&format!("1×{p}→450 | mlxbar")).contains("| 0 | none | – | – | – |"), "{md}");
        assert!(row(&format!("1×{p}→450 +prediction | mlxbar")).contains("| 0 | counted | 400 | 12 | 2.00 |"), "{md}");
        assert!(
            row(&format!("1×{p}→450 +prediction | <peer>")).contains("| 0 | sent, not counted | not reported | not reported | 1.00 |"),
            "{md}"
        );
        let html = html(&edit_run());
        assert!(html.contains("<th>× vs no prediction (e2e)</th>"), "{html}");
        assert!(html.contains("<td>counted</td><td>400</td><td>12</td><td>2.00</td>"), "{html}");
        // Runs without predicted cells keep their columns.
        assert!(!markdown(&run()).contains("prediction") && !super::html(&run()).contains("prediction"));
    }
}
