//! The runs over time, one row per scenario: origin calls per time slice on
//! the left (the herd is a wall of calls, its absence a lone call per
//! expiry), client latency per slice on the right (who waited, and when).

use std::error::Error;
use std::path::Path;

use plotters::prelude::*;

use crate::fleet::Mode;
use crate::report::RunResult;

/// Points of one line.
type Line = Vec<(f64, f64)>;

/// Zero origin calls are drawn on this floor: a log axis has no zero. Well
/// below 1, so a lone call per expiry stands out from it.
const FLOOR: f64 = 0.4;

fn color(mode: Mode) -> RGBColor {
    match mode {
        Mode::None => RGBColor(214, 39, 40),
        Mode::Local => RGBColor(255, 127, 14),
        Mode::Fleet => RGBColor(31, 119, 180),
        Mode::Nginx => RGBColor(44, 160, 44),
        Mode::Static => RGBColor(127, 127, 127),
    }
}

/// How a scenario's timeline is cut: in time slices, or burst by burst.
enum Bins {
    /// Slices of this many milliseconds.
    Time { slice_ms: f64, count: usize },
    /// One bin per burst, from its firing to the next (each run's own times).
    Bursts,
}

impl Bins {
    fn for_group(group: &[&RunResult]) -> Bins {
        // Bursts of different modes fire at different times; number them.
        if group.iter().any(|r| !r.bursts_us.is_empty()) {
            return Bins::Bursts;
        }
        let total_ms = group
            .iter()
            .map(|r| r.seconds * 1000.0)
            .fold(0.0, f64::max)
            .max(1.0);
        // About a hundred slices, in whole milliseconds.
        let slice_ms = (total_ms / 100.0).clamp(10.0, 100.0).round();
        Bins::Time {
            slice_ms,
            count: (total_ms / slice_ms).ceil() as usize,
        }
    }

    fn count(&self, run: &RunResult) -> usize {
        match self {
            Bins::Time { count, .. } => *count,
            Bins::Bursts => run.bursts_us.len(),
        }
    }

    /// The bin of an event at `us`; for bursts, of an event sent at `us`.
    fn of(&self, run: &RunResult, us: u64) -> usize {
        match self {
            Bins::Time { slice_ms, .. } => (us as f64 / 1000.0 / slice_ms) as usize,
            Bins::Bursts => run
                .bursts_us
                .partition_point(|&b| b <= us)
                .saturating_sub(1),
        }
    }

    /// Where bin `i` sits on the x axis.
    fn x(&self, i: usize) -> f64 {
        match self {
            Bins::Time { slice_ms, .. } => (i as f64 + 0.5) * slice_ms / 1000.0,
            Bins::Bursts => i as f64 + 1.0,
        }
    }

    fn x_max(&self, group: &[&RunResult]) -> f64 {
        match self {
            Bins::Time { slice_ms, count } => *count as f64 * slice_ms / 1000.0,
            Bins::Bursts => group.iter().map(|r| r.bursts_us.len()).max().unwrap_or(1) as f64 + 0.5,
        }
    }

    fn per(&self) -> String {
        match self {
            Bins::Time { slice_ms, .. } => format!("per {slice_ms:.0} ms"),
            Bins::Bursts => "per burst".to_owned(),
        }
    }

    fn x_desc(&self) -> &'static str {
        match self {
            Bins::Time { .. } => "seconds",
            Bins::Bursts => "burst",
        }
    }
}

/// Origin calls started in each bin.
fn origin_calls(run: &RunResult, bins: &Bins) -> Line {
    let mut counts = vec![0u64; bins.count(run)];
    for start in &run.origin.starts_us {
        if let Some(c) = counts.get_mut(bins.of(run, *start)) {
            *c += 1;
        }
    }
    counts
        .iter()
        .enumerate()
        .map(|(i, c)| (bins.x(i), if *c == 0 { FLOOR } else { *c as f64 }))
        .collect()
}

/// p99 latency of the requests in each bin (by when they were answered, or
/// for bursts by when they were sent); `None` where there were none.
fn p99s(run: &RunResult, bins: &Bins) -> Vec<Option<(f64, f64)>> {
    let mut by_bin: Vec<Vec<u32>> = vec![Vec::new(); bins.count(run)];
    for s in &run.samples {
        let at = match bins {
            Bins::Time { .. } => s.end_us(),
            Bins::Bursts => u64::from(s.start_us),
        };
        if let Some(v) = by_bin.get_mut(bins.of(run, at)) {
            v.push(s.latency_us);
        }
    }
    by_bin
        .into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            if v.is_empty() {
                return None;
            }
            v.sort_unstable();
            let p99 = v[((v.len() - 1) as f64 * 0.99).round() as usize];
            Some((bins.x(i), (f64::from(p99) / 1000.0).max(0.01)))
        })
        .collect()
}

/// Contiguous stretches of points, so a gap with no answers is not bridged.
fn stretches(points: Vec<Option<(f64, f64)>>) -> Vec<Line> {
    let mut out: Vec<Line> = vec![Vec::new()];
    for p in points {
        match p {
            Some(p) => out.last_mut().expect("never empty").push(p),
            None if out.last().is_some_and(|s| !s.is_empty()) => out.push(Vec::new()),
            None => {}
        }
    }
    out.retain(|s| !s.is_empty());
    out
}

pub fn draw(path: &Path, runs: &[RunResult], origin_delay_ms: u64) -> Result<(), Box<dyn Error>> {
    let mut scenarios = Vec::new();
    for run in runs {
        if !scenarios.contains(&run.setup.scenario) {
            scenarios.push(run.setup.scenario);
        }
    }
    if scenarios.is_empty() {
        return Ok(());
    }
    let root = SVGBackend::new(path, (1100, 250 * scenarios.len() as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let panels = root.split_evenly((scenarios.len(), 2));
    for (row, scenario) in scenarios.iter().enumerate() {
        let group: Vec<&RunResult> = runs
            .iter()
            .filter(|r| r.setup.scenario == *scenario)
            .collect();
        let bins = Bins::for_group(&group);
        let x_max = bins.x_max(&group);
        let calls: Vec<(Mode, String, Line)> = group
            .iter()
            .map(|r| (r.setup.mode, label(r), origin_calls(r, &bins)))
            .collect();
        let calls_max = calls
            .iter()
            .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
            .fold(1.0, f64::max);
        let mut chart = ChartBuilder::on(&panels[row * 2])
            .caption(
                format!("{scenario}: origin calls {}", bins.per()),
                ("sans-serif", 15),
            )
            .margin(8)
            .x_label_area_size(26)
            .y_label_area_size(44)
            // Headroom above the highest line keeps the legend off it.
            .build_cartesian_2d(0f64..x_max, (FLOOR..calls_max * 12.0).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_y_mesh()
            .x_desc(bins.x_desc())
            .y_labels(5)
            .x_labels(6)
            .x_label_formatter(&|x| format!("{x}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (mode, label, points) in calls {
            let c = color(mode);
            chart
                .draw_series(LineSeries::new(points, c.stroke_width(2)))?
                .label(label)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;

        let latencies: Vec<(Mode, Vec<Line>)> = group
            .iter()
            .map(|r| (r.setup.mode, stretches(p99s(r, &bins))))
            .collect();
        let lat_max = latencies
            .iter()
            .flat_map(|(_, s)| s.iter().flatten().map(|(_, y)| *y))
            .fold(origin_delay_ms as f64, f64::max);
        let mut chart = ChartBuilder::on(&panels[row * 2 + 1])
            .caption(
                format!("{scenario}: p99 latency {}, ms", bins.per()),
                ("sans-serif", 15),
            )
            .margin(8)
            .x_label_area_size(26)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..x_max, (0.05f64..lat_max * 2.0).log_scale())?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_y_mesh()
            .x_desc(bins.x_desc())
            .y_labels(5)
            .x_labels(6)
            .x_label_formatter(&|x| format!("{x}"))
            .y_label_formatter(&|y| format!("{y}"))
            .draw()?;
        for (mode, stretches) in latencies {
            let c = color(mode);
            for stretch in stretches {
                chart.draw_series(LineSeries::new(stretch, c.stroke_width(2)))?;
            }
        }
    }
    root.present()?;
    Ok(())
}

fn label(run: &RunResult) -> String {
    if run.setup.mode == Mode::Fleet && run.setup.backend != "redis" {
        "fleet (embedded: no Redis)".to_owned()
    } else {
        run.setup.mode.to_string()
    }
}
