//! The scenario lists of `jepsen suite` and `jepsen controls`: what each
//! scenario runs (workload, nemesis, time, kvnode build, environment,
//! flags) and the settings they share.

/// The kvnode variable `jepsen controls` sets for the lost-reply control:
/// the share of applied-write replies kvnode drops (clients retry).
pub const DROP_REPLY_ENV: &str = "KVNODE_TEST_DROP_WRITE_REPLY_PERCENT";
/// Share of write replies dropped in the lost-reply scenario (percent).
pub const DROP_REPLY_PERCENT: u8 = 20;

/// Which kvnode a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// The real build (`target/debug/kvnode`, or `--kvnode-bin`).
    Real,
    /// A build with these features, in [`super::BUILDS_DIR`].
    Features(&'static [&'static str]),
}

impl Build {
    pub(super) fn label(self) -> String {
        match self {
            Self::Real => "real".to_string(),
            Self::Features(features) => features.join("+"),
        }
    }
}

/// One scenario: the `jepsen run` flags and the build.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name (and output directory).
    pub name: &'static str,
    /// `--workload`.
    pub workload: &'static str,
    /// `--nemesis`.
    pub nemesis: &'static str,
    /// `--time`, seconds.
    pub seconds: u64,
    /// The kvnode build.
    pub build: Build,
    /// Environment for the run (and so for its kvnode members).
    pub env: Vec<(&'static str, String)>,
    /// Further `jepsen run` flags.
    pub args: Vec<&'static str>,
    /// Whether the run must be rejected by the checker (negative control).
    pub expect_caught: bool,
}

/// kvnode's variable for its snapshot interval in entries.
pub const SNAPSHOT_EVERY_ENTRIES_ENV: &str = "KVNODE_SNAPSHOT_EVERY_ENTRIES";
/// The variable of `kvnode run --snapshot-log-keep`.
pub const SNAPSHOT_LOG_KEEP_ENV: &str = "KVNODE_SNAPSHOT_LOG_KEEP";
/// The variable of the hidden `kvnode run --test-stale-build-before-switch`
/// (a test fault: the first received snapshot's install builds a stale
/// snapshot and holds before the engine switch).
pub const STALE_BUILD_ENV: &str = "KVNODE_TEST_STALE_BUILD_BEFORE_SWITCH";
/// Snapshot interval of the fsync control's scenario: small, so a snapshot
/// (durable) exists before the first power cut and the cluster has a state
/// to come back from once every log lost its un-fsynced entries.
pub const SNAPSHOT_EVERY_ENTRIES_CONTROL: u64 = 20;

/// The lazy-disk build (power loss).
const LAZY: &[&str] = &["lazy-disk"];

impl Scenario {
    /// Whether the run sets a test-only kvnode setting (a `KVNODE_TEST_*`
    /// variable, or `--session-idle-ms`, which `jepsen run` passes as one),
    /// which only a `testing` build reads.
    fn needs_test_hooks(&self) -> bool {
        self.env
            .iter()
            .any(|(name, _)| name.starts_with(crate::nemesis::power::TEST_ENV_PREFIX))
            || self.args.contains(&"--session-idle-ms")
    }

    /// The scenario with the `testing` feature added to its build when it
    /// needs the test hooks (a real-build scenario becomes a `testing`
    /// variant, built like the controls into [`super::BUILDS_DIR`]).
    fn with_test_hooks(mut self) -> Scenario {
        if self.needs_test_hooks() {
            let mut features = match self.build {
                Build::Real => Vec::new(),
                Build::Features(features) => features.to_vec(),
            };
            if !features.contains(&crate::nemesis::power::TESTING_FEATURE) {
                features.push(crate::nemesis::power::TESTING_FEATURE);
            }
            // A few scenarios per process: the leak is bounded.
            self.build = Build::Features(Box::leak(features.into_boxed_slice()));
        }
        self
    }
}

/// Shortest TTL of the `ttl-leader-change` scenario: above a failover
/// (about 5 s), so keys written just before a leader kill are still alive
/// when the next leader takes over.
pub const TTL_LEADER_CHANGE_TTL_MIN: &str = "6s";
/// Longest TTL of the `ttl-leader-change` scenario: below the idle
/// period, so the old clock's jump exceeds every TTL.
pub const TTL_LEADER_CHANGE_TTL_MAX: &str = "12s";
/// `restart-after-idle`'s idle period in the suite (above the longest TTL).
pub const TTL_LEADER_CHANGE_IDLE: &str = "15s";
/// The session idle window (ms) of the exactly-once scenario: a slow
/// worker's retry comes after its session was evicted.
pub const EXACTLY_ONCE_SESSION_IDLE_MS: u64 = 3000;

/// `ttl-leader-change`: the TTL workload under the idle-restart sequence,
/// leader kills, a leader partition and membership changes.
fn ttl_leader_change(name: &'static str, nemesis: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "ttl",
        nemesis,
        seconds,
        build: Build::Real,
        env: Vec::new(),
        args: vec![
            "--ttl-min",
            TTL_LEADER_CHANGE_TTL_MIN,
            "--ttl-max",
            TTL_LEADER_CHANGE_TTL_MAX,
            "--idle",
            TTL_LEADER_CHANGE_IDLE,
            // A membership change that removes the leader, or a leader
            // kill, is followed by an election: 3 s of calm is not always
            // enough for an ok write after it.
            "--quiet",
            "6s",
        ],
        expect_caught: false,
    }
}

/// `exactly-once`: put-if-absent adds, a fifth of the replies lost,
/// leader kills, a short session idle window.
fn exactly_once(name: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "exactly-once",
        nemesis: "kill-leader",
        seconds,
        build: Build::Real,
        env: vec![(DROP_REPLY_ENV, DROP_REPLY_PERCENT.to_string())],
        // Eight workers, six of them slow (more slow retries).
        args: vec![
            "--session-idle-ms",
            EXACTLY_ONCE_SESSION_IDLE_MS_ARG,
            "--concurrency",
            "8",
        ],
        expect_caught: false,
    }
}

/// The faults of the `watch` scenario: a leader cut off (its watchers
/// stall, then catch up), members killed and restarted (their watchers
/// resume on other members, from their next revision).
pub const WATCH_NEMESIS: &str = "partition-leader,kill,kill-leader";

/// `watch`: puts (some with a TTL), deletes and linearizable reads while
/// one watcher per member watches every key, under partitions and kills.
fn watch(name: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "watch",
        nemesis: WATCH_NEMESIS,
        seconds,
        build: Build::Real,
        env: Vec::new(),
        args: Vec::new(),
        expect_caught: false,
    }
}

/// The faults of the `lease` scenario: the leader cut off (owners talking
/// to it cannot renew; a build whose leader acknowledges keep-alives from
/// memory keeps acknowledging them there while the majority's new leader
/// lets the leases expire) and leader kills (a new leader must renew every
/// lease).
pub const LEASE_NEMESIS: &str = "partition-leader,kill-leader";
/// Shortest lease TTL of the `lease` scenario: above kvnode's 2 s minimum,
/// so keep-alives every third of it leave room for a slow one.
pub const LEASE_TTL_MIN: &str = "3s";
/// Longest lease TTL of the `lease` scenario: below what is left of a
/// cut-off leader's hold once the majority elected another (about 5 s of
/// [`LEASE_FAULT_HOLD`]), so a lease the new leader does not renew runs
/// out while the old one still acknowledges its keep-alives; and short
/// enough that leases kept 1–3 TTLs come and go several times in a run.
pub const LEASE_TTL_MAX: &str = "5s";
/// Fault hold of the `lease` scenario: a cut-off leader stays cut off
/// about 5 s after the majority's election (which takes about 5 s).
pub const LEASE_FAULT_HOLD: &str = "10s";

/// `lease`: owners keep leases alive and let them go while the leader is
/// cut off or killed; linearizable range reads and watchers look on.
fn lease(name: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "lease",
        nemesis: LEASE_NEMESIS,
        seconds,
        build: Build::Real,
        env: Vec::new(),
        args: vec![
            "--ttl-min",
            LEASE_TTL_MIN,
            "--ttl-max",
            LEASE_TTL_MAX,
            "--fault-hold",
            LEASE_FAULT_HOLD,
        ],
        expect_caught: false,
    }
}

/// The faults of the `redis-register` scenario: the leader cut off (its
/// clients' SETs and EXECs end unknown or refused, GETs fail, while the
/// majority elects another) and leader kills (connections break mid-
/// request; a restarted member comes back a follower).
pub const REDIS_REGISTER_NEMESIS: &str = "partition-leader,kill-leader";
/// Client processes of the `redis-register` scenario: two per member of
/// three, so two connections WATCH the same keys on each member (EXEC
/// aborts) and some process talks to whichever member leads.
pub const REDIS_REGISTER_CONCURRENCY: &str = "6";

/// `redis-register`: the register workload through every member's Redis
/// port (SET, GET, WATCH / MULTI / EXEC), checked by value, under leader
/// partitions and kills.
fn redis_register(name: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "redis-register",
        nemesis: REDIS_REGISTER_NEMESIS,
        seconds,
        build: Build::Real,
        env: Vec::new(),
        args: vec!["--concurrency", REDIS_REGISTER_CONCURRENCY],
        expect_caught: false,
    }
}

/// The faults of the `etcd-register` scenario: those of `redis-register`
/// (the leader cut off: its clients' puts and transactions end unknown,
/// its reads fail, while the majority elects another; leader kills:
/// channels break mid-request, a restarted member comes back a follower).
pub const ETCD_REGISTER_NEMESIS: &str = "partition-leader,kill-leader";
/// Client processes of the `etcd-register` scenario: two per member of
/// three, so every member takes reads, puts and transactions at once.
pub const ETCD_REGISTER_CONCURRENCY: &str = "6";
/// `--time` of the `etcd-register` scenario in the short suite: with
/// start-up, the heal and the final reads it adds about a minute.
pub const ETCD_REGISTER_SHORT_SECONDS: u64 = 40;

/// `etcd-register`: the register workload through every member's etcd
/// port (Range, Put, a Txn comparing the value), checked by value and by
/// the revision checks, under leader partitions and kills.
fn etcd_register(name: &'static str, seconds: u64) -> Scenario {
    Scenario {
        name,
        workload: "etcd-register",
        nemesis: ETCD_REGISTER_NEMESIS,
        seconds,
        build: Build::Real,
        env: Vec::new(),
        args: vec!["--concurrency", ETCD_REGISTER_CONCURRENCY],
        expect_caught: false,
    }
}

/// [`EXACTLY_ONCE_SESSION_IDLE_MS`] as the flag's text.
const EXACTLY_ONCE_SESSION_IDLE_MS_ARG: &str = "3000";

/// The suite's scenarios; `short`: 30–40 s each, else 5 minutes each and
/// the membership and combined scenarios too.
pub fn suite_scenarios(short: bool) -> Vec<Scenario> {
    let time = |s: u64| if short { s } else { 300 };
    let scenario = |name, nemesis, seconds, build| Scenario {
        name,
        workload: if nemesis == "clock" {
            "ttl"
        } else {
            "register"
        },
        nemesis,
        seconds: time(seconds),
        build,
        env: Vec::new(),
        args: Vec::new(),
        expect_caught: false,
    };
    let mut scenarios = vec![
        scenario("partition-leader", "partition-leader", 30, Build::Real),
        scenario("kill", "kill,kill-leader", 30, Build::Real),
        scenario("pause", "pause,pause-leader", 30, Build::Real),
        // The clock fault runs under the TTL workload (expiry is where
        // time matters).
        scenario("clock-ttl", "clock", 30, Build::Real),
        // Quiet periods of 6 s: after a power cut of the leader or of
        // every member, the election takes longer than the default 3 s,
        // and each calm period must see an ok read and an ok write.
        Scenario {
            args: vec!["--quiet", "6s"],
            ..scenario(
                "power-loss",
                "power-loss,power-loss-minority,power-loss-all",
                40,
                Build::Features(LAZY),
            )
        },
        ttl_leader_change(
            "ttl-leader-change",
            "restart-after-idle,kill-leader,partition-leader,membership",
            time(100),
        ),
        exactly_once("exactly-once", time(40)),
        watch("watch", time(40)),
        lease("lease", time(40)),
        redis_register("redis-register", time(40)),
        etcd_register("etcd-register", time(ETCD_REGISTER_SHORT_SECONDS)),
    ];
    if !short {
        scenarios.push(scenario("membership", "membership", 0, Build::Real));
        scenarios.push(scenario("combined", "combined", 0, Build::Real));
    }
    scenarios
        .into_iter()
        .map(Scenario::with_test_hooks)
        .collect()
}

/// The negative controls, each in the scenario that catches it. With
/// `baseline`, the same scenarios against the build without the `nc-*`
/// feature (each must pass).
pub fn control_scenarios(baseline: bool) -> Vec<Scenario> {
    let mut controls = vec![
        // A follower cut off keeps serving "linearizable" reads from its
        // own state while the majority moves on: the register workload
        // sends reads to every member round robin, so some read returns a
        // version older than an acknowledged write (stale read).
        Scenario {
            name: "nc-local-reads",
            workload: "register",
            nemesis: "partition-follower",
            seconds: 30,
            build: Build::Features(&["nc-local-reads"]),
            env: Vec::new(),
            args: Vec::new(),
            expect_caught: true,
        },
        // The isolated old leader acknowledges writes it can never commit;
        // the new leader's history never has them (lost writes, reads that
        // contradict acknowledged writes).
        Scenario {
            name: "nc-ack-before-commit",
            workload: "register",
            nemesis: "partition-leader",
            seconds: 30,
            build: Build::Features(&["nc-ack-before-commit"]),
            env: Vec::new(),
            args: Vec::new(),
            expect_caught: true,
        },
        // Every member loses its un-fsynced log at once, again and again:
        // committed entries vanish from every log and the cluster goes on
        // from its last snapshot (taken every SNAPSHOT_EVERY_ENTRIES_CONTROL
        // entries, so one exists before the first cut and the cluster comes
        // back): lost acknowledged writes, reads going back in time.
        Scenario {
            name: "nc-skip-log-fsync",
            workload: "register",
            nemesis: "power-loss-all",
            seconds: 40,
            build: Build::Features(&["lazy-disk", "nc-skip-log-fsync"]),
            env: vec![(
                SNAPSHOT_EVERY_ENTRIES_ENV,
                SNAPSHOT_EVERY_ENTRIES_CONTROL.to_string(),
            )],
            args: vec!["--quiet", "5s"],
            expect_caught: true,
        },
        // A fifth of write replies are lost after the write applied; the
        // client retries with the same session sequence, which applies the
        // write again: a compare-and-set whose retry fails its condition is
        // recorded failed while its value is there (phantom), and a write
        // re-applied later shows at two versions.
        Scenario {
            name: "nc-forget-sessions",
            workload: "register",
            nemesis: "none",
            seconds: 30,
            build: Build::Features(&["nc-forget-sessions"]),
            env: vec![(DROP_REPLY_ENV, DROP_REPLY_PERCENT.to_string())],
            args: Vec::new(),
            expect_caught: true,
        },
        // The old cluster clock: a member that ran through the idle period
        // carries it in its clock and, leading after restarted members,
        // jumps cluster time forward by it: every TTL key written under
        // the restarted leaders is observed expired at once (early expiry).
        Scenario {
            build: Build::Features(&["nc-old-clock"]),
            expect_caught: true,
            ..ttl_leader_change("nc-old-clock", "restart-after-idle", 75)
        },
        // Unknown sessions silently opened: a slow retry arriving after its
        // session was evicted (3 s window) applies again; its if-absent
        // condition fails on its own first application (duplicate apply).
        Scenario {
            build: Build::Features(&["nc-unknown-sessions"]),
            expect_caught: true,
            ..exactly_once("nc-unknown-sessions", 40)
        },
        // Snapshot chosen at startup by a counter, not by last_log_id. A
        // follower cut off while the leader snapshots every
        // SNAPSHOT_EVERY_ENTRIES_CONTROL entries and keeps no log behind
        // them is sent the leader's snapshot at the heal; the test fault
        // STALE_BUILD_ENV makes the race certain: the follower builds a
        // snapshot on its old engine after sealing the received one (a
        // higher counter, a lower last log id), then installs and holds its
        // next apply for 20 s; openraft purges its log through the received
        // snapshot once the install is done; within the hold (5 s of quiet
        // after the heal) every member loses power. Restarted on the stale build, the follower's state machine
        // is below its log's first entry: it never applies the run's
        // highest index (member-lost, not-durable). The fault fires once
        // per data directory.
        Scenario {
            name: "nc-snapshot-by-counter",
            workload: "register",
            nemesis: "partition-follower,power-loss-all",
            seconds: 60,
            build: Build::Features(&["lazy-disk", "nc-snapshot-by-counter"]),
            env: vec![
                (
                    SNAPSHOT_EVERY_ENTRIES_ENV,
                    SNAPSHOT_EVERY_ENTRIES_CONTROL.to_string(),
                ),
                (SNAPSHOT_LOG_KEEP_ENV, "0".to_string()),
                (STALE_BUILD_ENV, "true".to_string()),
            ],
            args: vec!["--quiet", "5s"],
            expect_caught: true,
        },
        // The log store renames its metadata without fsyncing the
        // directory (the lazy disk keeps directory changes until the
        // directory's fsync): a power cut brings the old vote back, and a
        // member that forgot its vote may vote twice in one term. The
        // power-loss faults check each victim's saved vote across the cut
        // (`nemesis::vote`): leader kills move the term, the cuts that
        // follow find it taken back (not-durable). Default snapshot
        // thresholds: no purge (whose directory fsync would also make the
        // rename durable) runs in the 60 s.
        Scenario {
            name: "nc-rename-no-dir-fsync",
            workload: "register",
            nemesis: "kill-leader,power-loss-all,kill-leader,power-loss-minority",
            seconds: 60,
            build: Build::Features(&["lazy-disk", "nc-rename-no-dir-fsync"]),
            env: Vec::new(),
            args: vec!["--quiet", "5s"],
            expect_caught: true,
        },
        // A member that, for a watch created with a start revision (a
        // resume, or a watcher that asks for one), drops the first event
        // it would send: the watcher's span then holds a revision it has
        // no event for, which other watchers (missing-event) or the
        // acknowledged write (acknowledged-missing) show.
        Scenario {
            build: Build::Features(&["nc-watch-skip"]),
            expect_caught: true,
            ..watch("nc-watch-skip", 40)
        },
        // The leader acknowledges keep-alives from its memory and writes a
        // renewal to the log only shortly before a lease would expire; a
        // new leader renews no lease. A leader cut off keeps acknowledging
        // its owners' keep-alives while the majority's new leader lets
        // their leases run out from the last renewal in the log: keys read
        // absent (and keep-alives answered "gone") before TTL after an
        // acknowledged keep-alive was sent (early-expiry).
        Scenario {
            build: Build::Features(&["nc-lease-leader-memory"]),
            expect_caught: true,
            ..lease("nc-lease-leader-memory", 40)
        },
    ];
    if baseline {
        for control in &mut controls {
            control.expect_caught = false;
            control.build = match control.build {
                Build::Features(features) if features.contains(&"lazy-disk") => {
                    Build::Features(LAZY)
                }
                _ => Build::Real,
            };
        }
    }
    controls
        .into_iter()
        .map(Scenario::with_test_hooks)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_short_suite_and_the_controls_name_the_issue_15_scenarios() {
        let short: Vec<_> = suite_scenarios(true).iter().map(|s| s.name).collect();
        assert!(short.contains(&"ttl-leader-change"), "{short:?}");
        assert!(short.contains(&"exactly-once"), "{short:?}");
        assert!(short.contains(&"watch"), "{short:?}");
        assert!(short.contains(&"lease"), "{short:?}");
        assert!(short.contains(&"redis-register"), "{short:?}");
        assert!(short.contains(&"etcd-register"), "{short:?}");
        let controls: Vec<_> = control_scenarios(false).iter().map(|s| s.name).collect();
        for name in [
            "nc-old-clock",
            "nc-unknown-sessions",
            "nc-snapshot-by-counter",
            "nc-rename-no-dir-fsync",
            "nc-watch-skip",
            "nc-lease-leader-memory",
        ] {
            assert!(controls.contains(&name), "{controls:?}");
        }
        for control in control_scenarios(false) {
            let Build::Features(features) = control.build else {
                panic!("{} runs the real build", control.name);
            };
            assert!(features.contains(&control.name), "{}", control.name);
            assert!(control.expect_caught);
        }
        // The baselines run without the nc-* feature.
        for control in control_scenarios(true) {
            assert!(!control.build.label().contains("nc-"), "{}", control.name);
            assert!(!control.expect_caught);
        }
        assert_eq!(
            EXACTLY_ONCE_SESSION_IDLE_MS.to_string(),
            EXACTLY_ONCE_SESSION_IDLE_MS_ARG
        );
    }

    #[test]
    fn a_scenario_with_a_test_setting_runs_a_testing_build() {
        let label = |scenarios: Vec<Scenario>, name: &str| {
            let scenario = scenarios.into_iter().find(|s| s.name == name).unwrap();
            scenario.build.label()
        };
        assert_eq!(label(suite_scenarios(true), "exactly-once"), "testing");
        assert_eq!(label(suite_scenarios(true), "partition-leader"), "real");
        assert_eq!(label(suite_scenarios(true), "power-loss"), "lazy-disk");
        assert_eq!(label(suite_scenarios(true), "redis-register"), "real");
        assert_eq!(label(suite_scenarios(true), "etcd-register"), "real");
        assert_eq!(
            label(control_scenarios(false), "nc-snapshot-by-counter"),
            "lazy-disk+nc-snapshot-by-counter+testing"
        );
        assert_eq!(
            label(control_scenarios(false), "nc-forget-sessions"),
            "nc-forget-sessions+testing"
        );
        assert_eq!(
            label(control_scenarios(false), "nc-local-reads"),
            "nc-local-reads"
        );
        // Baselines keep the hooks their scenario needs, without the nc-* feature.
        assert_eq!(
            label(control_scenarios(true), "nc-snapshot-by-counter"),
            "lazy-disk+testing"
        );
        assert_eq!(
            label(control_scenarios(true), "nc-unknown-sessions"),
            "testing"
        );
    }
}
