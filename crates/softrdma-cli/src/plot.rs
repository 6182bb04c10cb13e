//! Bandwidth-over-message-size plots for docs/PERFORMANCE.md, drawn with `plotters` into SVG
//! from the JSON lines `softrdma perf --json` and `softrdma baseline` print.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// One series: a label and (size, MB/s) points.
pub type Series = (String, Vec<(f64, f64)>);

/// Read series from JSON lines: rows with `size` and `mb_per_s` are grouped by a `series`
/// field (or by `test`/`baseline` and `mode`).
pub fn series_from_jsonl(text: &str) -> Vec<Series> {
    let mut out: Vec<Series> = Vec::new();
    for line in text.lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        let (Some(size), Some(mb)) = (v["size"].as_f64(), v["mb_per_s"].as_f64()) else {
            continue;
        };
        let label = v["series"].as_str().map(str::to_owned).unwrap_or_else(|| {
            let name = v["test"].as_str().or(v["baseline"].as_str()).unwrap_or("?");
            match v["mode"].as_str() {
                Some(m) => format!("{name} ({m})"),
                None => name.to_owned(),
            }
        });
        match out.iter_mut().find(|s| s.0 == label) {
            Some(s) => s.1.push((size, mb)),
            None => out.push((label, vec![(size, mb)])),
        }
    }
    for s in &mut out {
        s.1.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// Draw the series (log2 size axis) into an SVG file.
pub fn bandwidth_svg(series: &[Series], title: &str, out: &Path) -> Res<()> {
    let max_y = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.1))
        .fold(100.0f64, f64::max)
        * 1.1;
    let (lo, hi) = series
        .iter()
        .flat_map(|s| s.1.iter().map(|p| p.0))
        .fold((f64::MAX, 0.0f64), |(a, b), x| (a.min(x), b.max(x)));
    if hi <= 0.0 {
        return Err("nothing to plot".into());
    }
    let root = SVGBackend::new(out, (900, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(lo.log2()..hi.log2(), 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        .y_desc("MB/s")
        .x_label_formatter(&|x| {
            let b = 2f64.powf(x.round());
            if b >= 1048576.0 {
                format!("{}M", b / 1048576.0)
            } else if b >= 1024.0 {
                format!("{}K", b / 1024.0)
            } else {
                format!("{b}")
            }
        })
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (i, (label, pts)) in series.iter().enumerate() {
        let c = colors[i % colors.len()];
        let pts: Vec<(f64, f64)> = pts.iter().map(|(x, y)| (x.log2(), *y)).collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?
            .label(label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}
