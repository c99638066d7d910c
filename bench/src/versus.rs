//! raftcask vs etcd (feature `etcd`): the matrix `etcd-compare` runs
//! (workload × clients, the three [`Contender`]s taking turns inside each
//! cell, the order rotating from cell to cell so drift hits all), its one
//! comparison table and its SVG (throughput, p99 latency and the members'
//! CPU per operation per cell, one bar per contender).
//!
//! The contenders: raftcask through its native gRPC API, raftcask through
//! its etcd v3 port (`raftcask-etcd`: the etcd backend of the load loop,
//! the same `etcd-client` code that drives etcd, dialling raftcask's etcd
//! ports), and etcd. All run the same [`crate::load`] loop with the same
//! [`LoadConfig`] (only the endpoints and the backend differ): same keys,
//! values, clients, connections and duration. Writes go to the leader
//! (found once with the etcd `Status` call for both etcd-API contenders,
//! by redirects for native raftcask). Linearizable reads run twice: all to
//! the leader, and spread over the three members as the clients do by
//! default (a follower confirms a read index with the leader: etcd's
//! ReadIndex, raftcask's `ReadIndex` RPC, then reads its own state). Stale
//! reads (etcd: serializable) are spread over the three members.
//!
//! CPU per operation: when the matrix knows the member processes' ids, the
//! user + system CPU time they used over a run (`/proc/PID/stat`, all
//! three members together, connection setup included) divided by the
//! operations acknowledged in it. raftcask-etcd's minus raftcask's is what
//! the etcd translation costs per operation (same server processes, same
//! load). The load generator's own CPU per operation (this process, all
//! its threads, over the same run) is a column of its own: it shares the
//! machine's cores with the members, so where CPU is the limit the ops/s
//! ratio of two contenders is that of (members' + load generator's CPU
//! per operation), not of the members' alone.

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
pub const PLOT_SIZE_PIXELS: (u32, u32) = (1200, 1200);
/// Width of one contender's bar in the SVG, in cells (three per cell).
pub const BAR_WIDTH: f64 = 0.27;

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

/// One system of the comparison: which cluster answers and which API the
/// load speaks to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Contender {
    /// raftcask through its native gRPC API.
    Raftcask,
    /// raftcask through its etcd v3 port, driven by the etcd backend.
    RaftcaskEtcd,
    /// etcd.
    Etcd,
}

impl Contender {
    /// Every contender, in the order the first cell runs them.
    pub const ALL: [Contender; 3] = [
        Contender::Raftcask,
        Contender::RaftcaskEtcd,
        Contender::Etcd,
    ];

    /// Its name in the table and the plot's legend.
    pub fn name(self) -> &'static str {
        match self {
            Contender::Raftcask => "raftcask",
            Contender::RaftcaskEtcd => "raftcask-etcd",
            Contender::Etcd => "etcd",
        }
    }

    /// The load loop's backend for it.
    pub fn system(self) -> System {
        match self {
            Contender::Raftcask => System::Raftcask,
            Contender::RaftcaskEtcd | Contender::Etcd => System::Etcd,
        }
    }

    /// Its colour in the plot.
    fn color(self) -> RGBColor {
        match self {
            Contender::Raftcask => RGBColor(31, 119, 180),
            Contender::RaftcaskEtcd => RGBColor(44, 160, 44),
            Contender::Etcd => RGBColor(230, 120, 0),
        }
    }
}

/// The settings shared by every cell.
#[derive(Clone, Debug)]
pub struct MatrixConfig {
    /// raftcask's client (native gRPC) addresses.
    pub raftcask: Vec<String>,
    /// raftcask's etcd port addresses (the same members).
    pub raftcask_etcd: Vec<String>,
    /// etcd's client addresses.
    pub etcd: Vec<String>,
    /// raftcask's member process ids (empty: CPU per operation not measured).
    pub raftcask_pids: Vec<u32>,
    /// etcd's member process ids (empty: CPU per operation not measured).
    pub etcd_pids: Vec<u32>,
    /// Client counts.
    pub clients: Vec<usize>,
    /// Measured time of one contender in one cell.
    pub duration: Duration,
    /// Connections per endpoint.
    pub connections: usize,
    /// Key length.
    pub key_size_bytes: usize,
    /// Keys drawn from `0..key_space`.
    pub key_space: u64,
    /// Seed of keys and values (the same for every contender in a cell).
    pub seed: u64,
}

impl MatrixConfig {
    /// The endpoints `contender` is driven at.
    pub fn endpoints(&self, contender: Contender) -> &[String] {
        match contender {
            Contender::Raftcask => &self.raftcask,
            Contender::RaftcaskEtcd => &self.raftcask_etcd,
            Contender::Etcd => &self.etcd,
        }
    }

    /// The server processes whose CPU `contender`'s runs are charged.
    pub fn pids(&self, contender: Contender) -> &[u32] {
        match contender {
            Contender::Raftcask | Contender::RaftcaskEtcd => &self.raftcask_pids,
            Contender::Etcd => &self.etcd_pids,
        }
    }
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
    /// The members' CPU time (user + system, all members) per successful
    /// operation, µs; None when not measured or nothing succeeded.
    pub cpu_us_per_op: Option<f64>,
    /// The load generator's CPU time (this process) per successful
    /// operation, µs; None when not measured or nothing succeeded.
    pub load_cpu_us_per_op: Option<f64>,
}

impl Summary {
    /// The figures of `report`; `cpu_seconds` is what the members used
    /// over it, when measured.
    pub fn of(report: &LoadReport, cpu_seconds: Option<f64>) -> Summary {
        let ms = |q: f64| report.latency_us.value_at_quantile(q) as f64 / 1000.0;
        Summary {
            ops_per_second: report.ops_per_second(),
            p50_ms: ms(0.5),
            p99_ms: ms(0.99),
            p999_ms: ms(0.999),
            errors: report.errors_total(),
            cpu_us_per_op: per_op(report, cpu_seconds),
            load_cpu_us_per_op: None,
        }
    }

    /// With the load generator's CPU over the run (`load_seconds`).
    pub fn with_load_cpu(self, report: &LoadReport, load_seconds: Option<f64>) -> Summary {
        Summary {
            load_cpu_us_per_op: per_op(report, load_seconds),
            ..self
        }
    }
}

/// `seconds` of CPU per successful operation of `report`, in µs.
fn per_op(report: &LoadReport, seconds: Option<f64>) -> Option<f64> {
    seconds
        .filter(|_| report.ops_ok > 0)
        .map(|seconds| seconds * 1e6 / report.ops_ok as f64)
}

/// One cell's outcome.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    /// The workload's name.
    pub workload: &'static str,
    /// Concurrent clients.
    pub clients: usize,
    /// Native raftcask's figures.
    pub raftcask: Summary,
    /// raftcask-through-the-etcd-API's figures.
    pub raftcask_etcd: Summary,
    /// etcd's figures.
    pub etcd: Summary,
    /// The order the contenders ran in.
    pub order: [Contender; 3],
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

    /// `contender`'s figures.
    pub fn summary(&self, contender: Contender) -> &Summary {
        match contender {
            Contender::Raftcask => &self.raftcask,
            Contender::RaftcaskEtcd => &self.raftcask_etcd,
            Contender::Etcd => &self.etcd,
        }
    }

    /// The contender that ran first.
    pub fn first(&self) -> Contender {
        self.order[0]
    }

    /// Where `contender` ran in the cell, from 1.
    pub fn position(&self, contender: Contender) -> usize {
        self.order.iter().position(|c| *c == contender).unwrap_or(0) + 1
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

/// The user + system CPU time the processes `pids` have used so far, in
/// seconds (fields 14 and 15 of `/proc/PID/stat`, every thread included).
/// An error names the process that could not be read (it exited).
pub fn cpu_seconds(pids: &[u32]) -> std::io::Result<f64> {
    let ticks_per_second = rustix::param::clock_ticks_per_second().max(1) as f64;
    let mut ticks = 0u64;
    for pid in pids {
        let path = format!("/proc/{pid}/stat");
        let stat = std::fs::read_to_string(&path)
            .map_err(|err| std::io::Error::new(err.kind(), format!("{path}: {err}")))?;
        ticks += stat_cpu_ticks(&stat).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{path}: no utime and stime fields"),
            )
        })?;
    }
    Ok(ticks as f64 / ticks_per_second)
}

/// utime + stime of one `/proc/PID/stat` line, in clock ticks. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted
/// after its last `)`: the state is field 3 there, utime 14, stime 15.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
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
    for (field, endpoints) in [
        ("raftcask", &matrix.raftcask),
        ("raftcask_etcd", &matrix.raftcask_etcd),
        ("etcd", &matrix.etcd),
    ] {
        if endpoints.is_empty() {
            return err(field, String::new(), "at least one endpoint".into());
        }
    }
    for (field, pids) in [
        ("raftcask_pids", &matrix.raftcask_pids),
        ("etcd_pids", &matrix.etcd_pids),
    ] {
        if let Err(e) = cpu_seconds(pids) {
            return err(
                field,
                format!("{pids:?}"),
                format!("ids of running processes whose /proc/PID/stat is readable ({e})"),
            );
        }
    }
    Ok(())
}

/// Runs every cell: for each workload and client count, the three
/// contenders one after the other, the order rotating by one from cell to
/// cell. `on_cell` sees each cell as it finishes (for progress output).
pub async fn run_matrix(
    matrix: &MatrixConfig,
    mut on_cell: impl FnMut(&Cell),
) -> Result<Vec<Cell>, ConfigError> {
    validate(matrix)?;
    let mut cells = Vec::new();
    for workload in &WORKLOADS {
        for &clients in &matrix.clients {
            let mut order = Contender::ALL;
            order.rotate_left(cells.len() % Contender::ALL.len());
            let mut summaries = [None; 3];
            for contender in order {
                let config = cell_config(matrix, workload, clients, matrix.endpoints(contender));
                let pids = matrix.pids(contender);
                // A member that exited mid-matrix leaves the figure empty
                // (its errors show in the row) rather than ending the run.
                let cpu_before = (!pids.is_empty()).then(|| cpu_seconds(pids).ok()).flatten();
                let me = [std::process::id()];
                let load_before = cpu_seconds(&me).ok();
                let report =
                    run_system(config, contender.system(), Arc::new(Progress::default())).await?;
                let used = |before: Option<f64>, pids: &[u32]| {
                    before.and_then(|before| {
                        cpu_seconds(pids)
                            .ok()
                            .map(|after| (after - before).max(0.0))
                    })
                };
                let cpu = used(cpu_before, pids);
                let load_cpu = used(load_before, &me);
                let slot = Contender::ALL.iter().position(|c| *c == contender);
                if let Some(slot) = slot {
                    summaries[slot] =
                        Some(Summary::of(&report, cpu).with_load_cpu(&report, load_cpu));
                }
            }
            if let [Some(raftcask), Some(raftcask_etcd), Some(etcd)] = summaries {
                let cell = Cell {
                    workload: workload.name,
                    clients,
                    raftcask,
                    raftcask_etcd,
                    etcd,
                    order,
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

/// A figure with two decimals, or `n/a`.
fn decimals(value: Option<f64>) -> String {
    value.map_or_else(|| "n/a".into(), |v| format!("{v:.2}"))
}

/// What a ratio column shows on the row of the contender it is relative to.
const SELF_RATIO: &str = "-";

/// The headers of [`table`].
pub const HEADERS: [&str; 16] = [
    "workload",
    "clients",
    "system",
    "ops/s",
    "p50 ms",
    "p99 ms",
    "p99.9 ms",
    "errors",
    "ops/s / etcd",
    "p99 / etcd",
    "ops/s / native",
    "p99 / native",
    "CPU µs/op",
    "CPU µs/op - native",
    "load gen µs/op",
    "ran",
];

/// The comparison table: one row per contender and cell. Ratios are the
/// row's figure over etcd's and over native raftcask's in the same cell
/// (ops/s above 1 and p99 below 1 are better); the CPU difference to
/// native raftcask is, on the raftcask-etcd row, the etcd translation's
/// cost per operation.
pub fn table(title: &str, cells: &[Cell]) -> Table {
    let mut table = Table::new(title, &HEADERS);
    for cell in cells {
        let (native, etcd) = (&cell.raftcask, &cell.etcd);
        for contender in Contender::ALL {
            let s = cell.summary(contender);
            let versus = |other: &Summary, is_self: bool| {
                if is_self {
                    [SELF_RATIO.to_string(), SELF_RATIO.to_string()]
                } else {
                    [
                        ratio(s.ops_per_second, other.ops_per_second),
                        ratio(s.p99_ms, other.p99_ms),
                    ]
                }
            };
            let [ops_etcd, p99_etcd] = versus(etcd, contender == Contender::Etcd);
            let [ops_native, p99_native] = match contender {
                Contender::RaftcaskEtcd => versus(native, false),
                _ => [SELF_RATIO.to_string(), SELF_RATIO.to_string()],
            };
            let cpu_minus_native = match contender {
                Contender::RaftcaskEtcd => decimals(
                    s.cpu_us_per_op
                        .zip(native.cpu_us_per_op)
                        .map(|(a, b)| a - b),
                ),
                _ => SELF_RATIO.to_string(),
            };
            table.row(vec![
                cell.workload.to_string(),
                cell.clients.to_string(),
                contender.name().to_string(),
                count(s.ops_per_second),
                format!("{:.2}", s.p50_ms),
                format!("{:.2}", s.p99_ms),
                format!("{:.2}", s.p999_ms),
                count(s.errors as f64),
                ops_etcd,
                p99_etcd,
                ops_native,
                p99_native,
                decimals(s.cpu_us_per_op),
                cpu_minus_native,
                decimals(s.load_cpu_us_per_op),
                cell.position(contender).to_string(),
            ]);
        }
    }
    table.note(
        "systems: raftcask = native gRPC API; raftcask-etcd = raftcask's etcd v3 port driven by \
         the same etcd-client load code as etcd; etcd = etcd 3.4. Ratios are the row's figure over \
         etcd's / native raftcask's in the same cell: ops/s above 1 and p99 below 1 favour the row. \
         Latency per successful operation as the client sees it. CPU µs/op = the three members' \
         user+system CPU over the run (/proc/PID/stat) / operations acknowledged (n/a: not \
         measured); `- native` on the raftcask-etcd row is the etcd translation's CPU per \
         operation. load gen µs/op = the load generator's own user+system CPU over the run / \
         operations acknowledged: it shares the cores, so where CPU is the limit ops/s ratios \
         follow (members' + load generator's CPU per op). `ran` = the contender's place in the \
         cell's order (rotating cell to cell).",
    );
    table
}

/// Writes the comparison SVG: ops/s, p99 latency and the members' CPU per
/// operation per cell, one bar per contender (a CPU figure not measured
/// draws no bar).
pub fn write_svg(
    path: &Path,
    title: &str,
    cells: &[Cell],
) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, PLOT_SIZE_PIXELS).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((3, 1));
    let labels: Vec<String> = cells.iter().map(Cell::short_label).collect();
    type Pick = fn(&Summary) -> Option<f64>;
    let panels: [(String, &str, Pick); 3] = [
        (format!("{title}: throughput"), "ops/s", |s| {
            Some(s.ops_per_second)
        }),
        ("p99 latency".to_string(), "p99 ms", |s| Some(s.p99_ms)),
        (
            "members' CPU per operation (all three members)".to_string(),
            "CPU µs/op",
            |s| s.cpu_us_per_op,
        ),
    ];
    let n = cells.len().max(1);
    let bar = BAR_WIDTH;
    for (area, (caption, y_desc, pick)) in areas.iter().zip(panels) {
        let top = cells
            .iter()
            .flat_map(|c| Contender::ALL.map(|k| pick(c.summary(k)).unwrap_or(0.0)))
            .fold(0.0f64, f64::max)
            .max(f64::MIN_POSITIVE)
            * 1.15;
        let mut chart = ChartBuilder::on(area)
            .caption(caption, ("sans-serif", 20))
            .margin(15)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(0.0..n as f64, 0.0..top)?;
        let labels = labels.clone();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n * 2 + 1)
            .x_label_formatter(&move |x: &f64| {
                // Labels sit at the middle of each cell's group of bars.
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
        for (index, contender) in Contender::ALL.into_iter().enumerate() {
            let fill = contender.color().filled();
            let offset = (1.0 - bar * 3.0) / 2.0 + bar * index as f64;
            chart
                .draw_series(cells.iter().enumerate().filter_map(|(i, cell)| {
                    let value = pick(cell.summary(contender))?;
                    let x = i as f64 + offset;
                    Some(Rectangle::new([(x, 0.0), (x + bar, value)], fill))
                }))?
                .label(contender.name())
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

    fn summary(ops: f64, p99: f64, cpu: Option<f64>) -> Summary {
        Summary {
            ops_per_second: ops,
            p50_ms: 1.0,
            p99_ms: p99,
            p999_ms: 9.0,
            errors: 0,
            cpu_us_per_op: cpu,
            load_cpu_us_per_op: cpu.map(|c| c / 4.0),
        }
    }

    fn cell(workload: &'static str, clients: usize, order: [Contender; 3]) -> Cell {
        Cell {
            workload,
            clients,
            raftcask: summary(8000.0, 5.0, Some(100.0)),
            raftcask_etcd: summary(6000.0, 6.0, Some(130.0)),
            etcd: summary(4000.0, 10.0, None),
            order,
        }
    }

    #[test]
    fn table_rows_carry_ratios_to_etcd_and_to_native() {
        let cells = [cell(
            "put 256 B",
            64,
            [
                Contender::Etcd,
                Contender::Raftcask,
                Contender::RaftcaskEtcd,
            ],
        )];
        let markdown = table("t", &cells).to_markdown();
        for row in [
            "| put 256 B | 64 | raftcask | 8 000 | 1.00 | 5.00 | 9.00 | 0 | 2.00 | 0.50 | - | - | 100.00 | - | 25.00 | 2 |",
            "| put 256 B | 64 | raftcask-etcd | 6 000 | 1.00 | 6.00 | 9.00 | 0 | 1.50 | 0.60 | 0.75 | 1.20 | 130.00 | 30.00 | 32.50 | 3 |",
            "| put 256 B | 64 | etcd | 4 000 | 1.00 | 10.00 | 9.00 | 0 | - | - | - | - | n/a | - | n/a | 1 |",
        ] {
            assert!(markdown.contains(row), "{row} missing from\n{markdown}");
        }
        assert_eq!(ratio(1.0, 0.0), "n/a");
    }

    #[test]
    fn cpu_per_op_needs_a_measure_and_a_success() {
        let mut report = LoadReport {
            ops_ok: 0,
            errors: Default::default(),
            redirects: 0,
            elapsed: Duration::from_secs(1),
            latency_us: hdrhistogram::Histogram::new(3).expect("histogram"),
            writes_acked: 0,
            write_entries: 0,
            timeline: Vec::new(),
        };
        assert_eq!(Summary::of(&report, Some(1.0)).cpu_us_per_op, None);
        report.ops_ok = 4000;
        assert_eq!(Summary::of(&report, None).cpu_us_per_op, None);
        assert_eq!(Summary::of(&report, Some(0.5)).cpu_us_per_op, Some(125.0));
        let with_load = Summary::of(&report, None).with_load_cpu(&report, Some(0.1));
        assert_eq!(with_load.load_cpu_us_per_op, Some(25.0));
    }

    #[test]
    fn stat_fields_count_after_the_command_name() {
        // A command name with a space and a parenthesis, then state (3)
        // ... utime (14) = 250, stime (15) = 50.
        let stat = "42 (tokio (x) y) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0";
        assert_eq!(stat_cpu_ticks(stat), Some(300));
        assert_eq!(stat_cpu_ticks("42 (cut) S 1"), None);
        // This process has used some CPU by now, and is readable.
        let me = cpu_seconds(&[std::process::id()]).expect("own stat");
        assert!(me >= 0.0);
        assert_eq!(cpu_seconds(&[]).expect("no process"), 0.0);
    }

    #[test]
    fn bounds_name_the_setting() {
        let matrix = MatrixConfig {
            raftcask: vec!["a:1".into()],
            raftcask_etcd: vec!["a:2".into()],
            etcd: vec!["b:1".into()],
            raftcask_pids: Vec::new(),
            etcd_pids: Vec::new(),
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
            ..matrix
        };
        assert_eq!(validate(&matrix), Ok(()));
        let missing = MatrixConfig {
            raftcask_etcd: Vec::new(),
            ..matrix.clone()
        };
        assert_eq!(validate(&missing).unwrap_err().field, "raftcask_etcd");
        let missing = MatrixConfig {
            etcd: Vec::new(),
            ..matrix.clone()
        };
        assert_eq!(validate(&missing).unwrap_err().field, "etcd");
        // No process has id u32::MAX (pid_max is at most 2^22).
        let gone = MatrixConfig {
            raftcask_pids: vec![std::process::id(), u32::MAX],
            ..matrix.clone()
        };
        assert_eq!(validate(&gone).unwrap_err().field, "raftcask_pids");
    }

    #[test]
    fn the_svg_names_every_contender_and_every_cell() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.svg");
        let cells = [
            cell("put 256 B", 1, Contender::ALL),
            cell(
                "get linearizable",
                64,
                [
                    Contender::RaftcaskEtcd,
                    Contender::Etcd,
                    Contender::Raftcask,
                ],
            ),
        ];
        write_svg(&path, "raftcask vs etcd", &cells).expect("svg");
        let svg = std::fs::read_to_string(&path).expect("read svg");
        for text in [
            "raftcask",
            "raftcask-etcd",
            "etcd",
            "put 256B x1",
            "get lin x64",
            "CPU",
        ] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
