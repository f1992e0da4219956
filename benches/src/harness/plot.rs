//! The comparison plot: one SVG with a bar chart per headline figure, the
//! paths side by side (and each proxy where the figure is per proxy), so a
//! reader sees at a glance what the tunnel costs against direct. Same-node
//! CPU bars are its one proxy's, beside the two of the other paths.

use std::path::Path;

use plotters::prelude::*;

use crate::harness::figures::Figures;
use crate::harness::report::Round;

/// Plot size in pixels: four panels in a 2×2 grid.
const SIZE: (u32, u32) = (1200, 800);

/// One panel: a title and labelled bars.
struct Panel {
    title: &'static str,
    bars: Vec<(String, f64)>,
}

/// Writes the plot of `figures` (build A's medians) to `path`.
pub fn write(figures: &Figures, path: &Path) -> anyhow::Result<()> {
    let panels = panels(figures);
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((2, 2)).iter().zip(&panels) {
        draw(area, panel)?;
    }
    root.present()?;
    Ok(())
}

fn panels(figures: &Figures) -> Vec<Panel> {
    let bars = |names: &[(&str, &str)]| -> Vec<(String, f64)> {
        names
            .iter()
            .filter_map(|(label, name)| {
                figures
                    .get(*name)
                    .map(|value| ((*label).to_owned(), *value))
            })
            .collect()
    };
    vec![
        Panel {
            title: "one stream, Gbit/s (higher is better)",
            bars: bars(&[
                ("direct", "direct.stream1.gbit_per_s"),
                ("tcp", "tcp.stream1.gbit_per_s"),
                ("hbone", "hbone.stream1.gbit_per_s"),
                ("hbone ×8", "hbone.stream8.gbit_per_s"),
                ("same-node", "same-node.stream1.gbit_per_s"),
            ]),
        },
        Panel {
            title: "1 KiB request/response p50, µs (lower is better)",
            bars: bars(&[
                ("direct", "direct.rr.p50_us"),
                ("tcp", "tcp.rr.p50_us"),
                ("hbone", "hbone.rr.p50_us"),
                ("same-node", "same-node.rr.p50_us"),
            ]),
        },
        Panel {
            title: "CPU s per GB, per proxy (lower is better)",
            bars: bars(&[
                ("tcp client", "tcp.stream1.client.cpu_s_per_gb"),
                ("tcp server", "tcp.stream1.server.cpu_s_per_gb"),
                ("hbone client", "hbone.stream1.client.cpu_s_per_gb"),
                ("hbone server", "hbone.stream1.server.cpu_s_per_gb"),
                ("same-node", "same-node.stream1.both.cpu_s_per_gb"),
            ]),
        },
        Panel {
            title: "CPU µs per request / per new connection (lower is better)",
            bars: bars(&[
                ("rr client", "hbone.rr.client.cpu_us_per_request"),
                ("rr server", "hbone.rr.server.cpu_us_per_request"),
                ("conn client", "hbone.connect.client.cpu_us_per_connection"),
                ("conn server", "hbone.connect.server.cpu_us_per_connection"),
                ("rr same-node", "same-node.rr.both.cpu_us_per_request"),
                (
                    "conn same-node",
                    "same-node.connect.both.cpu_us_per_connection",
                ),
            ]),
        },
    ]
}

fn draw<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let top = panel
        .bars
        .iter()
        .map(|(_, value)| *value)
        .fold(0.0, f64::max)
        .max(f64::MIN_POSITIVE)
        * 1.15;
    let count = panel.bars.len().max(1);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d((0..count).into_segmented(), 0.0..top)?;
    let labels: Vec<String> = panel.bars.iter().map(|(label, _)| label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|segment| match segment {
            SegmentValue::CenterOf(index) => labels.get(*index).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .draw()?;
    chart.draw_series(panel.bars.iter().enumerate().map(|(index, (_, value))| {
        let color = Palette99::pick(index).filled();
        let mut bar = Rectangle::new(
            [
                (SegmentValue::Exact(index), 0.0),
                (SegmentValue::Exact(index + 1), *value),
            ],
            color,
        );
        bar.set_margin(0, 0, 12, 12);
        bar
    }))?;
    chart.draw_series(panel.bars.iter().enumerate().map(|(index, (_, value))| {
        Text::new(
            format!("{value:.2}"),
            (SegmentValue::CenterOf(index), *value),
            ("sans-serif", 13),
        )
    }))?;
    Ok(())
}

/// The figures drawn per round when two builds are compared, with their
/// panel titles: the ones the comparison with istio/ztunnel is stated in.
const PER_ROUND: [(&str, &str); 9] = [
    (
        "hbone.connect.both.cpu_us_per_connection",
        "CPU µs per new connection, both proxies",
    ),
    (
        "hbone.rr.both.cpu_us_per_request",
        "CPU µs per request, both proxies",
    ),
    (
        "hbone.stream1.both.cpu_s_per_gb",
        "CPU s per GB, both proxies",
    ),
    ("hbone.stream1.gbit_per_s", "one stream, Gbit/s"),
    (
        "hbone.idle.both.kib_per_connection",
        "KiB per idle connection, both proxies",
    ),
    ("hbone.rr1k.added_p99_us", "added p99 µs at 1,000 req/s"),
    ("hbone.rr.p50_us", "1 KiB request/response p50 µs"),
    ("hbone.connect.connections_per_s", "new connections per s"),
    (
        "hbone.stream1.machine_above_direct.cpu_s_per_gb",
        "machine CPU s per GB above direct",
    ),
];

/// Writes the per-round plot of an A/B run to `path`: one panel per
/// figure of [`PER_ROUND`], each build's value in every round as a line,
/// both builds on one chart, named as the report names them.
pub fn write_rounds(rounds: &[Round], names: &[String; 2], path: &Path) -> anyhow::Result<()> {
    let root = SVGBackend::new(path, ROUNDS_SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, (figure, title)) in root.split_evenly((3, 3)).iter().zip(PER_ROUND) {
        let series: Vec<(&str, Vec<(usize, f64)>)> = [("A", &names[0]), ("B", &names[1])]
            .into_iter()
            .map(|(build, name)| {
                let points = rounds
                    .iter()
                    .filter(|round| round.build == build)
                    .filter_map(|round| Some((round.index, *round.figures.get(figure)?)))
                    .collect();
                (name.as_str(), points)
            })
            .collect();
        draw_rounds(area, title, &series)?;
    }
    root.present()?;
    Ok(())
}

/// Plot size in pixels of the per-round plot: nine panels, 3×3.
const ROUNDS_SIZE: (u32, u32) = (1500, 1050);

fn draw_rounds<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    series: &[(&str, Vec<(usize, f64)>)],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let values = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, value)| *value));
    let top = values.fold(0.0, f64::max).max(f64::MIN_POSITIVE) * 1.2;
    let last = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(round, _)| *round))
        .max()
        .unwrap_or(1)
        .max(2);
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(28)
        .y_label_area_size(55)
        .build_cartesian_2d(1..last, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("round")
        .x_labels(last)
        .draw()?;
    for (index, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(
            points
                .iter()
                .map(|point| Circle::new(*point, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_round_plot_draws_both_builds_under_their_names() {
        let round = |index: usize, build: &'static str, value: f64| Round {
            index,
            build,
            runs: Vec::new(),
            figures: Figures::from([(PER_ROUND[0].0.to_owned(), value)]),
        };
        let rounds = [
            round(1, "A", 200.0),
            round(1, "B", 120.0),
            round(2, "A", 210.0),
            round(2, "B", 118.0),
        ];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rounds.svg");
        write_rounds(&rounds, &["istio".to_owned(), "ours".to_owned()], &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"), "{svg}");
        for text in ["istio", "ours", PER_ROUND[0].1, PER_ROUND[8].1] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
