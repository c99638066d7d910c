//! raftcask vs etcd (feature `etcd`): the matrix `etcd-compare` runs
//! (workload × clients, the two systems alternating inside each cell so
//! drift hits both), its one comparison table and its SVG (throughput and
//! p99 latency per cell, one bar per system).
//!
//! Both systems run the same [`crate::load`] loop with the same
//! [`LoadConfig`] (only the endpoints differ): same keys, values, clients,
//! connections and duration. Writes go to the leader (found once for
//! etcd, by redirects for raftcask). Linearizable reads run twice: all to
//! the leader, and spread over the three members as both systems' clients
//! do by default (a follower confirms a read index with the leader: etcd's
//! ReadIndex, raftcask's `ReadIndex` RPC, then reads its own state). Stale
//! reads (etcd: serializable) are spread over the three members.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kvproto::kv::v1::Consistency;
use plotters::prelude::*;

use crate::load::{
    ConfigError, LoadConfig, LoadReport, OPS_MAX, OpKind, Progress, ReadTarget, System, run_system,
};
use crate::report::{Table, count};

/// Client counts of the full matrix.
pub const CLIENTS_FULL: [usize; 3] = [1, 16, 64];
/// Client counts of the `--quick` matrix.
pub const CLIENTS_QUICK: [usize; 2] = [1, 64];
/// Longest measured run of one system in one cell.
pub const CELL_DURATION_MAX: Duration = Duration::from_secs(300);
/// Size of the SVG in pixels (width, height).
pub const PLOT_SIZE_PIXELS: (u32, u32) = (1200, 900);

/// One workload of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Its name in the table.
    pub name: &'static str,
    /// Its name on the plot's axis.
    pub short: &'static str,
    /// Puts or gets.
    pub op: OpKind,
    /// Value size of the puts.
    pub value_size_bytes: usize,
    /// Consistency of the gets.
    pub consistency: Consistency,
    /// Where gets go.
    pub read_target: ReadTarget,
}

/// The workloads, in the order they run (puts first: they fill the
/// key space the gets read).
pub const WORKLOADS: [Workload; 5] = [
    Workload {
        name: "put 256 B",
        short: "put 256B",
        op: OpKind::Put,
        value_size_bytes: 256,
        consistency: Consistency::Linearizable,
        read_target: ReadTarget::Leader,
    },
    Workload {
        name: "put 4 KiB",
        short: "put 4KiB",
        op: OpKind::Put,
        value_size_bytes: 4096,
        consistency: Consistency::Linearizable,
        read_target: ReadTarget::Leader,
    },
    Workload {
        name: "get linearizable",
        short: "get lin",
        op: OpKind::Get,
        value_size_bytes: 256,
        consistency: Consistency::Linearizable,
        read_target: ReadTarget::Leader,
    },
    Workload {
        name: "get linearizable, any member",
        short: "get lin any",
        op: OpKind::Get,
        value_size_bytes: 256,
        consistency: Consistency::Linearizable,
        read_target: ReadTarget::Spread,
    },
    Workload {
        name: "get stale/serializable",
        short: "get stale",
        op: OpKind::Get,
        value_size_bytes: 256,
        consistency: Consistency::Stale,
        read_target: ReadTarget::Spread,
    },
];

/// The settings shared by every cell.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    /// raftcask's client addresses.
    pub raftcask: Vec<String>,
    /// etcd's client addresses.
    pub etcd: Vec<String>,
    /// Client counts.
    pub clients: Vec<usize>,
    /// Measured time of one system in one cell.
    pub duration: Duration,
    /// Connections per endpoint.
    pub connections: usize,
    /// Key length.
    pub key_size_bytes: usize,
    /// Keys drawn from `0..key_space`.
    pub key_space: u64,
    /// Seed of keys and values (the same for both systems in a cell).
    pub seed: u64,
}

/// What the table shows of one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    /// Successful operations per second.
    pub ops_per_second: f64,
    /// Latency percentiles in ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// 99.9th percentile, ms.
    pub p999_ms: f64,
    /// Failed operations.
    pub errors: u64,
}

impl Summary {
    /// The figures of `report`.
    pub fn of(report: &LoadReport) -> Summary {
        let ms = |q: f64| report.latency_us.value_at_quantile(q) as f64 / 1000.0;
        Summary {
            ops_per_second: report.ops_per_second(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            errors: report.errors_total(),
        }
    }
}

/// One cell's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// The workload's name.
    pub workload: &'static str,
    /// Concurrent clients.
    pub clients: usize,
    /// raftcask's figures.
    pub raftcask: Summary,
    /// etcd's figures.
    pub etcd: Summary,
    /// Which system ran first.
    pub first: System,
}

impl Cell {
    /// The workload and client count, as in the table.
    pub fn label(&self) -> String {
        format!("{} x{}", self.workload, self.clients)
    }

    /// A shorter label for the plot's axis.
    pub fn short_label(&self) -> String {
        let short = WORKLOADS
            .iter()
            .find(|w| w.name == self.workload)
            .map_or(self.workload, |w| w.short);
        format!("{short} x{}", self.clients)
    }
}

/// The load settings of one cell against `endpoints`.
pub fn cell_config(
    matrix: &MatrixConfig,
    workload: &Workload,
    clients: usize,
    endpoints: &[String],
) -> LoadConfig {
    LoadConfig {
        endpoints: endpoints.to_vec(),
        clients,
        connections: matrix.connections,
        ops: OPS_MAX,
        duration: matrix.duration,
        key_size_bytes: matrix.key_size_bytes,
        value_size_bytes: workload.value_size_bytes,
        key_space: matrix.key_space,
        op: workload.op,
        consistency: workload.consistency,
        read_target: workload.read_target,
        seed: matrix.seed,
    }
}

/// Checks the matrix settings (each cell's load settings are checked by
/// the load generator).
pub fn validate(matrix: &MatrixConfig) -> Result<(), ConfigError> {
    let err = |field, value: String, rule: String| Err(ConfigError { field, value, rule });
    if matrix.duration.is_zero() || matrix.duration > CELL_DURATION_MAX {
        return err(
            "duration",
            format!("{:?}", matrix.duration),
            format!("above zero and at most {CELL_DURATION_MAX:?} (CELL_DURATION_MAX)"),
        );
    }
    if matrix.clients.is_empty() {
        return err("clients", String::new(), "at least one client count".into());
    }
    for (field, endpoints) in [("raftcask", &matrix.raftcask), ("etcd", &matrix.etcd)] {
        if endpoints.is_empty() {
            return err(field, String::new(), "at least one endpoint".into());
        }
    }
    Ok(())
}

/// Runs every cell: for each workload and client count, both systems one
/// after the other, the first alternating from cell to cell. `on_cell` sees
/// each cell as it finishes (for progress output).
pub async fn run_matrix(
    matrix: &MatrixConfig,
    mut on_cell: impl FnMut(&Cell),
) -> Result<Vec<Cell>, ConfigError> {
    validate(matrix)?;
    let mut cells = Vec::new();
    for workload in &WORKLOADS {
        for &clients in &matrix.clients {
            let order = if cells.len() % 2 == 0 {
                [System::Raftcask, System::Etcd]
            } else {
                [System::Etcd, System::Raftcask]
            };
            let mut raftcask = None;
            let mut etcd = None;
            for system in order {
                let endpoints = match system {
                    System::Raftcask => &matrix.raftcask,
                    System::Etcd => &matrix.etcd,
                };
                let config = cell_config(matrix, workload, clients, endpoints);
                let report = run_system(config, system, Arc::new(Progress::default())).await?;
                let summary = Summary::of(&report);
                match system {
                    System::Raftcask => raftcask = Some(summary),
                    System::Etcd => etcd = Some(summary),
                }
            }
            if let (Some(raftcask), Some(etcd)) = (raftcask, etcd) {
                let cell = Cell {
                    workload: workload.name,
                    clients,
                    raftcask,
                    etcd,
                    first: order[0],
                };
                on_cell(&cell);
                cells.push(cell);
            }
        }
    }
    Ok(cells)
}

/// `a / b` with two decimals, or `n/a` when `b` is zero.
fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}", a / b)
    } else {
        "n/a".into()
    }
}

/// The headers of [`table`].
pub const HEADERS: [&str; 15] = [
    "workload",
    "clients",
    "raftcask ops/s",
    "etcd ops/s",
    "ops/s ratio",
    "raftcask p50 ms",
    "etcd p50 ms",
    "raftcask p99 ms",
    "etcd p99 ms",
    "p99 ratio",
    "raftcask p99.9 ms",
    "etcd p99.9 ms",
    "raftcask errors",
    "etcd errors",
    "first",
];

/// The comparison table: one row per cell; ratios are raftcask / etcd (so
/// above 1 is better for ops/s, below 1 better for p99).
pub fn table(title: &str, cells: &[Cell]) -> Table {
    let mut table = Table::new(title, &HEADERS);
    for cell in cells {
        let (r, e) = (&cell.raftcask, &cell.etcd);
        table.row(vec![
            cell.workload.to_string(),
            cell.clients.to_string(),
            count(r.ops_per_second),
            count(e.ops_per_second),
            ratio(r.ops_per_second, e.ops_per_second),
            format!("{:.2}", r.p50_ms),
            format!("{:.2}", e.p50_ms),
            format!("{:.2}", r.p99_ms),
            format!("{:.2}", e.p99_ms),
            ratio(r.p99_ms, e.p99_ms),
            format!("{:.2}", r.p999_ms),
            format!("{:.2}", e.p999_ms),
            count(r.errors as f64),
            count(e.errors as f64),
            cell.first.name().to_string(),
        ]);
    }
    table.note("ratios are raftcask / etcd: ops/s above 1 and p99 below 1 favour raftcask; latency per successful operation as the client sees it; `first` = the system that ran first in the cell");
    table
}

/// Colour of each system in the plot.
fn color(system: System) -> RGBColor {
    match system {
        System::Raftcask => RGBColor(31, 119, 180),
        System::Etcd => RGBColor(230, 120, 0),
    }
}

/// Writes the comparison SVG: ops/s per cell above p99 latency per cell,
/// one bar per system.
pub fn write_svg(
    path: &Path,
    title: &str,
    cells: &[Cell],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, PLOT_SIZE_PIXELS).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(PLOT_SIZE_PIXELS.1 / 2);
    let labels: Vec<String> = cells.iter().map(Cell::short_label).collect();
    type Pick = fn(&Summary) -> f64;
    let panels: [(_, String, &str, Pick); 2] = [
        (upper, format!("{title}: throughput"), "ops/s", |s| {
            s.ops_per_second
        }),
        (lower, "p99 latency".to_string(), "p99 ms", |s| s.p99_ms),
    ];
    let n = cells.len().max(1);
    for (area, caption, y_desc, pick) in panels {
        let top = cells
            .iter()
            .flat_map(|c| [pick(&c.raftcask), pick(&c.etcd)])
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE)
            * 1.15;
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(70)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)?;
        let labels = labels.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&move |x: &f64| {
                // Labels sit at the middle of each cell's pair of bars.
                let slot = (x - 0.5).round();
                if (x - 0.5 - slot).abs() < 1e-6 && slot >= 0.0 {
                    labels.get(slot as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .x_label_style(("sans-serif", 12))
            .y_label_formatter(&|y: &f64| format!("{y:.0}"))
            .y_desc(y_desc)
            .draw()?;
        for (offset, system) in [(0.1, System::Raftcask), (0.5, System::Etcd)] {
            let fill = color(system).filled();
            chart
                .draw_series(cells.iter().enumerate().map(|(i, cell)| {
                    let summary = match system {
                        System::Raftcask => &cell.raftcask,
                        System::Etcd => &cell.etcd,
                    };
                    let x = i as f64 + offset;
                    Rectangle::new([(x, 0.0), (x + 0.4, pick(summary))], fill)
                }))?
                .label(system.name())
                .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], fill));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(ops: f64, p99: f64) -> Summary {
        Summary {
            ops_per_second: ops,
            p50_ms: 1.0,
            p99_ms: p99,
            p999_ms: 9.0,
            errors: 0,
        }
    }

    #[test]
    fn table_ratios_are_raftcask_over_etcd() {
        let cells = [Cell {
            workload: "put 256 B",
            clients: 64,
            raftcask: summary(8000.0, 5.0),
            etcd: summary(4000.0, 10.0),
            first: System::Etcd,
        }];
        let markdown = table("t", &cells).to_markdown();
        assert!(
            markdown.contains(
                "| put 256 B | 64 | 8 000 | 4 000 | 2.00 | 1.00 | 1.00 | 5.00 | 10.00 | 0.50 |"
            ),
            "{markdown}"
        );
        assert!(markdown.contains("| etcd |"), "{markdown}");
        assert_eq!(ratio(1.0, 0.0), "n/a");
    }

    #[test]
    fn bounds_name_the_setting() {
        let matrix = MatrixConfig {
            raftcask: vec!["a:1".into()],
            etcd: vec!["b:1".into()],
            clients: vec![1],
            duration: Duration::ZERO,
            connections: 1,
            key_size_bytes: 16,
            key_space: 10,
            seed: 1,
        };
        assert_eq!(validate(&matrix).unwrap_err().field, "duration");
        let matrix = MatrixConfig {
            duration: Duration::from_secs(1),
            etcd: Vec::new(),
            ..matrix
        };
        assert_eq!(validate(&matrix).unwrap_err().field, "etcd");
    }

    #[test]
    fn the_svg_names_both_systems_and_every_cell() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.svg");
        let cells = [
            Cell {
                workload: "put 256 B",
                clients: 1,
                raftcask: summary(500.0, 2.0),
                etcd: summary(400.0, 3.0),
                first: System::Raftcask,
            },
            Cell {
                workload: "get linearizable",
                clients: 64,
                raftcask: summary(30000.0, 4.0),
                etcd: summary(7000.0, 12.0),
                first: System::Etcd,
            },
        ];
        write_svg(&path, "raftcask vs etcd", &cells).expect("svg");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        for text in ["raftcask", "etcd", "put 256B x1", "get lin x64"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
