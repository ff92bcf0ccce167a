//! The result of one run and how it is printed: a table row, or one JSON object per line.

use serde::Serialize;

use shmlink_measure::size;
use shmlink_measure::stats::Percentiles;
use shmlink_measure::Mode;

/// CPU time per message of each end, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CpuPerMsg {
    pub client: f64,
    pub server: f64,
}

/// One run's result. Serialises to exactly the documented JSON fields.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunResult {
    /// The transport's name (`shm`, `ux`, `tcp`).
    pub transport: String,
    pub size: usize,
    /// Measured messages (round trips in latency mode).
    pub count: u64,
    pub window: u64,
    /// Latency mode only.
    pub rtt_ns: Option<Percentiles>,
    /// Throughput mode only.
    pub msgs_per_s: Option<f64>,
    /// Throughput mode only.
    pub bytes_per_s: Option<f64>,
    pub cpu_us_per_msg: CpuPerMsg,
}

impl RunResult {
    /// The result as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a RunResult always serialises")
    }
}

/// Formats results as an aligned table, the header before the first row.
pub struct Table {
    mode: Mode,
    header_done: bool,
}

fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
}

impl Table {
    pub fn new(mode: Mode) -> Table {
        Table {
            mode,
            header_done: false,
        }
    }

    /// The header line.
    pub fn header(&self) -> String {
        match self.mode {
            Mode::Latency => format!(
                "{:<9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
                "transport",
                "size",
                "count",
                "p50 us",
                "p90 us",
                "p99 us",
                "p99.9 us",
                "max us",
                "cpu/rt cli",
                "cpu/rt srv"
            ),
            Mode::Throughput => format!(
                "{:<9} {:>8} {:>9} {:>6} {:>12} {:>11} {:>12} {:>12}",
                "transport",
                "size",
                "count",
                "window",
                "msgs/s",
                "MiB/s",
                "cpu/msg cli",
                "cpu/msg srv"
            ),
        }
    }

    /// One result as a table line.
    pub fn row(&self, r: &RunResult) -> String {
        let cpu = |x: f64| format!("{x:.3} us");
        match (self.mode, &r.rtt_ns) {
            (Mode::Latency, Some(p)) => format!(
                "{:<9} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12}",
                r.transport,
                size::exact(r.size),
                r.count,
                us(p.p50),
                us(p.p90),
                us(p.p99),
                us(p.p999),
                us(p.max),
                cpu(r.cpu_us_per_msg.client),
                cpu(r.cpu_us_per_msg.server)
            ),
            _ => format!(
                "{:<9} {:>8} {:>9} {:>6} {:>12.0} {:>11.1} {:>12} {:>12}",
                r.transport,
                size::exact(r.size),
                r.count,
                r.window,
                r.msgs_per_s.unwrap_or(f64::NAN),
                r.bytes_per_s.unwrap_or(f64::NAN) / (1u64 << 20) as f64,
                cpu(r.cpu_us_per_msg.client),
                cpu(r.cpu_us_per_msg.server)
            ),
        }
    }

    /// `r` as a table line, after the header if it is the first row.
    pub fn next(&mut self, r: &RunResult) -> String {
        if self.header_done {
            self.row(r)
        } else {
            self.header_done = true;
            format!("{}\n{}", self.header(), self.row(r))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_has_exactly_the_documented_fields() {
        let r = RunResult {
            transport: "shm".into(),
            size: 64,
            count: 10,
            window: 1,
            rtt_ns: Some(Percentiles {
                p50: 1,
                p90: 2,
                p99: 3,
                p999: 4,
                max: 5,
            }),
            msgs_per_s: None,
            bytes_per_s: None,
            cpu_us_per_msg: CpuPerMsg {
                client: 0.5,
                server: 0.25,
            },
        };
        assert_eq!(
            r.to_json(),
            r#"{"transport":"shm","size":64,"count":10,"window":1,"rtt_ns":{"p50":1,"p90":2,"p99":3,"p999":4,"max":5},"msgs_per_s":null,"bytes_per_s":null,"cpu_us_per_msg":{"client":0.5,"server":0.25}}"#
        );
        let mut t = Table::new(Mode::Latency);
        assert_eq!(t.header().len(), t.row(&r).len());
        assert_eq!(t.next(&r).lines().count(), 2, "header and row");
        assert_eq!(t.next(&r).lines().count(), 1, "row only");
    }
}
