//! The command table: every command the Redis front end answers, with
//! Redis's arity, flags, key positions, group and documentation, and the
//! answers of `COMMAND`, `COMMAND COUNT`, `COMMAND INFO`, `COMMAND LIST`
//! and `COMMAND DOCS` built from it (redis-cli's hints come from COMMAND
//! DOCS: summary, since, group and each argument's name, type, token and
//! flags).

use super::resp::Reply;

/// How the connection runs a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Reads the store: after the read step, against the local state.
    Read,
    /// Changes the store: one request down the write path.
    Write,
    /// Answered by the connection itself (connection and server commands,
    /// transactions).
    Local,
}

/// One command (or subcommand) of the table.
#[derive(Debug)]
pub struct Spec {
    /// Lowercase name (a subcommand's without its container).
    pub name: &'static str,
    /// Redis's arity: `n` exactly n arguments (the name counted), `-n` at
    /// least n.
    pub arity: i64,
    /// How it runs.
    pub kind: Kind,
    /// Redis's command flags (`COMMAND INFO`).
    pub flags: &'static [&'static str],
    /// First key argument (0: none), last (-1: the last argument), step.
    pub keys: (i64, i64, i64),
    /// Redis's command group (also the metrics family).
    pub group: &'static str,
    /// The Redis version that added it.
    pub since: &'static str,
    /// One line of documentation.
    pub summary: &'static str,
    /// Its arguments in a small notation: `name`, `TOKEN`, `TOKEN name`,
    /// `[optional]`, `a|b` (one of), `(block)`, a `...` suffix (repeats).
    pub arguments: &'static str,
    /// Subcommands (CLIENT, CONFIG, COMMAND).
    pub subcommands: &'static [Spec],
}

// One argument per column of the table below.
#[allow(clippy::too_many_arguments)]
const fn spec(
    name: &'static str,
    arity: i64,
    kind: Kind,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
    group: &'static str,
    since: &'static str,
    summary: &'static str,
    arguments: &'static str,
) -> Spec {
    Spec {
        name,
        arity,
        kind,
        flags,
        keys,
        group,
        since,
        summary,
        arguments,
        subcommands: &[],
    }
}

use Kind::{Local, Read, Write};

const RO_FAST: &[&str] = &["readonly", "fast"];
const RO: &[&str] = &["readonly"];
const W_OOM: &[&str] = &["write", "denyoom"];
const W_OOM_FAST: &[&str] = &["write", "denyoom", "fast"];
const W_FAST: &[&str] = &["write", "fast"];
const W: &[&str] = &["write"];
const CONN: &[&str] = &["noscript", "loading", "stale", "fast"];
const TX: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];
const SRV: &[&str] = &["loading", "stale"];
const ONE: (i64, i64, i64) = (1, 1, 1);
const NONE: (i64, i64, i64) = (0, 0, 0);
const ALL_KEYS: (i64, i64, i64) = (1, -1, 1);
const EXPIRE_ARGS: &str = "key seconds [NX|XX|GT|LT]";

/// CLIENT's subcommands.
static CLIENT: &[Spec] = &[
    spec(
        "setname",
        3,
        Local,
        CONN,
        NONE,
        "connection",
        "2.6.9",
        "Set the current connection name",
        "connection-name",
    ),
    spec(
        "getname",
        2,
        Local,
        CONN,
        NONE,
        "connection",
        "2.6.9",
        "Get the current connection name",
        "",
    ),
    spec(
        "id",
        2,
        Local,
        CONN,
        NONE,
        "connection",
        "5.0.0",
        "Returns the client ID for the current connection",
        "",
    ),
    spec(
        "info",
        2,
        Local,
        CONN,
        NONE,
        "connection",
        "6.2.0",
        "Returns information about the current client connection.",
        "",
    ),
    spec(
        "list",
        -2,
        Local,
        CONN,
        NONE,
        "connection",
        "2.4.0",
        "Get the list of client connections",
        "[TYPE type] [ID client-id...]",
    ),
    spec(
        "setinfo",
        4,
        Local,
        CONN,
        NONE,
        "connection",
        "7.2.0",
        "Set client or connection specific info",
        "LIB-NAME libname|LIB-VER libver",
    ),
    spec(
        "help",
        2,
        Local,
        CONN,
        NONE,
        "connection",
        "5.0.0",
        "Show helpful text about the different subcommands",
        "",
    ),
];

/// CONFIG's subcommands.
static CONFIG: &[Spec] = &[
    spec(
        "get",
        -3,
        Local,
        SRV,
        NONE,
        "server",
        "2.0.0",
        "Get the values of configuration parameters",
        "parameter...",
    ),
    spec(
        "set",
        -4,
        Local,
        SRV,
        NONE,
        "server",
        "2.0.0",
        "Set configuration parameters to the given values (raftcask: refused)",
        "(parameter value)...",
    ),
    spec(
        "resetstat",
        2,
        Local,
        SRV,
        NONE,
        "server",
        "2.0.0",
        "Reset the stats returned by INFO",
        "",
    ),
    spec(
        "help",
        2,
        Local,
        SRV,
        NONE,
        "server",
        "5.0.0",
        "Show helpful text about the different subcommands",
        "",
    ),
];

/// COMMAND's subcommands.
static COMMAND: &[Spec] = &[
    spec(
        "count",
        2,
        Local,
        SRV,
        NONE,
        "server",
        "2.8.13",
        "Get total number of Redis commands",
        "",
    ),
    spec(
        "docs",
        -2,
        Local,
        SRV,
        NONE,
        "server",
        "7.0.0",
        "Get array of specific Redis command documentation",
        "[command-name...]",
    ),
    spec(
        "info",
        -2,
        Local,
        SRV,
        NONE,
        "server",
        "2.8.13",
        "Get array of specific Redis command details, or all when no argument is given.",
        "[command-name...]",
    ),
    spec(
        "list",
        -2,
        Local,
        SRV,
        NONE,
        "server",
        "7.0.0",
        "Get an array of Redis command names",
        "",
    ),
    spec(
        "help",
        2,
        Local,
        SRV,
        NONE,
        "server",
        "5.0.0",
        "Show helpful text about the different subcommands",
        "",
    ),
];

/// Every command, in the order COMMAND lists them.
pub static COMMANDS: &[Spec] = &[
    // Strings.
    spec(
        "get",
        2,
        Read,
        RO_FAST,
        ONE,
        "string",
        "1.0.0",
        "Get the value of a key",
        "key",
    ),
    spec(
        "set",
        -3,
        Write,
        W_OOM,
        ONE,
        "string",
        "1.0.0",
        "Set the string value of a key",
        "key value [NX|XX] [GET] [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|KEEPTTL]",
    ),
    spec(
        "setnx",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Set the value of a key, only if the key does not exist",
        "key value",
    ),
    spec(
        "setex",
        4,
        Write,
        W_OOM,
        ONE,
        "string",
        "2.0.0",
        "Set the value and expiration of a key",
        "key seconds value",
    ),
    spec(
        "psetex",
        4,
        Write,
        W_OOM,
        ONE,
        "string",
        "2.6.0",
        "Set the value and expiration in milliseconds of a key",
        "key milliseconds value",
    ),
    spec(
        "getset",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Set the string value of a key and return its old value",
        "key value",
    ),
    spec(
        "getdel",
        2,
        Write,
        W_FAST,
        ONE,
        "string",
        "6.2.0",
        "Get the value of a key and delete the key",
        "key",
    ),
    spec(
        "getex",
        -2,
        Write,
        W_FAST,
        ONE,
        "string",
        "6.2.0",
        "Get the value of a key and optionally set its expiration",
        "key [EX seconds|PX milliseconds|EXAT unix-time-seconds|PXAT unix-time-milliseconds|PERSIST]",
    ),
    spec(
        "mget",
        -2,
        Read,
        RO_FAST,
        ALL_KEYS,
        "string",
        "1.0.0",
        "Get the values of all the given keys",
        "key...",
    ),
    spec(
        "mset",
        -3,
        Write,
        W_OOM,
        (1, -1, 2),
        "string",
        "1.0.1",
        "Set multiple keys to multiple values",
        "(key value)...",
    ),
    spec(
        "msetnx",
        -3,
        Write,
        W_OOM,
        (1, -1, 2),
        "string",
        "1.0.1",
        "Set multiple keys to multiple values, only if none of the keys exist",
        "(key value)...",
    ),
    spec(
        "incr",
        2,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Increment the integer value of a key by one",
        "key",
    ),
    spec(
        "decr",
        2,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Decrement the integer value of a key by one",
        "key",
    ),
    spec(
        "incrby",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Increment the integer value of a key by the given amount",
        "key increment",
    ),
    spec(
        "decrby",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "1.0.0",
        "Decrement the integer value of a key by the given number",
        "key decrement",
    ),
    spec(
        "incrbyfloat",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "2.6.0",
        "Increment the float value of a key by the given amount",
        "key increment",
    ),
    spec(
        "append",
        3,
        Write,
        W_OOM_FAST,
        ONE,
        "string",
        "2.0.0",
        "Append a value to a key",
        "key value",
    ),
    spec(
        "strlen",
        2,
        Read,
        RO_FAST,
        ONE,
        "string",
        "2.2.0",
        "Get the length of the value stored in a key",
        "key",
    ),
    spec(
        "getrange",
        4,
        Read,
        RO,
        ONE,
        "string",
        "2.4.0",
        "Get a substring of the string stored at a key",
        "key start end",
    ),
    spec(
        "setrange",
        4,
        Write,
        W_OOM,
        ONE,
        "string",
        "2.2.0",
        "Overwrite part of a string at key starting at the specified offset",
        "key offset value",
    ),
    // Keys.
    spec(
        "del",
        -2,
        Write,
        W,
        ALL_KEYS,
        "generic",
        "1.0.0",
        "Delete a key",
        "key...",
    ),
    spec(
        "unlink",
        -2,
        Write,
        W_FAST,
        ALL_KEYS,
        "generic",
        "4.0.0",
        "Delete a key asynchronously in another thread. Otherwise it is just as DEL, but non blocking.",
        "key...",
    ),
    spec(
        "exists",
        -2,
        Read,
        RO_FAST,
        ALL_KEYS,
        "generic",
        "1.0.0",
        "Determine if a key exists",
        "key...",
    ),
    spec(
        "expire",
        -3,
        Write,
        W_FAST,
        ONE,
        "generic",
        "1.0.0",
        "Set a key's time to live in seconds",
        EXPIRE_ARGS,
    ),
    spec(
        "pexpire",
        -3,
        Write,
        W_FAST,
        ONE,
        "generic",
        "2.6.0",
        "Set a key's time to live in milliseconds",
        "key milliseconds [NX|XX|GT|LT]",
    ),
    spec(
        "expireat",
        -3,
        Write,
        W_FAST,
        ONE,
        "generic",
        "1.2.0",
        "Set the expiration for a key as a UNIX timestamp",
        "key unix-time-seconds [NX|XX|GT|LT]",
    ),
    spec(
        "pexpireat",
        -3,
        Write,
        W_FAST,
        ONE,
        "generic",
        "2.6.0",
        "Set the expiration for a key as a UNIX timestamp specified in milliseconds",
        "key unix-time-milliseconds [NX|XX|GT|LT]",
    ),
    spec(
        "ttl",
        2,
        Read,
        RO_FAST,
        ONE,
        "generic",
        "1.0.0",
        "Get the time to live for a key in seconds",
        "key",
    ),
    spec(
        "pttl",
        2,
        Read,
        RO_FAST,
        ONE,
        "generic",
        "2.6.0",
        "Get the time to live for a key in milliseconds",
        "key",
    ),
    spec(
        "expiretime",
        2,
        Read,
        RO_FAST,
        ONE,
        "generic",
        "7.0.0",
        "Get the expiration Unix timestamp for a key",
        "key",
    ),
    spec(
        "pexpiretime",
        2,
        Read,
        RO_FAST,
        ONE,
        "generic",
        "7.0.0",
        "Get the expiration Unix timestamp for a key in milliseconds",
        "key",
    ),
    spec(
        "persist",
        2,
        Write,
        W_FAST,
        ONE,
        "generic",
        "2.2.0",
        "Remove the expiration from a key",
        "key",
    ),
    spec(
        "type",
        2,
        Read,
        RO_FAST,
        ONE,
        "generic",
        "1.0.0",
        "Determine the type stored at key",
        "key",
    ),
    spec(
        "rename",
        3,
        Write,
        W,
        (1, 2, 1),
        "generic",
        "1.0.0",
        "Rename a key",
        "key newkey",
    ),
    spec(
        "renamenx",
        3,
        Write,
        W_FAST,
        (1, 2, 1),
        "generic",
        "1.0.0",
        "Rename a key, only if the new key does not exist",
        "key newkey",
    ),
    spec(
        "keys",
        2,
        Read,
        RO,
        NONE,
        "generic",
        "1.0.0",
        "Find all keys matching the given pattern",
        "pattern",
    ),
    spec(
        "scan",
        -2,
        Read,
        RO,
        NONE,
        "generic",
        "2.8.0",
        "Incrementally iterate the keys space",
        "cursor [MATCH pattern] [COUNT count] [TYPE type]",
    ),
    spec(
        "randomkey",
        1,
        Read,
        RO,
        NONE,
        "generic",
        "1.0.0",
        "Return a random key from the keyspace",
        "",
    ),
    spec(
        "dbsize",
        1,
        Read,
        RO_FAST,
        NONE,
        "server",
        "1.0.0",
        "Return the number of keys in the selected database",
        "",
    ),
    spec(
        "flushdb",
        -1,
        Write,
        W,
        NONE,
        "server",
        "1.0.0",
        "Remove all keys from the current database",
        "[ASYNC|SYNC]",
    ),
    spec(
        "flushall",
        -1,
        Write,
        W,
        NONE,
        "server",
        "1.0.0",
        "Remove all keys from all databases",
        "[ASYNC|SYNC]",
    ),
    // Hashes.
    spec(
        "hset",
        -4,
        Write,
        W_OOM_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Set the string value of a hash field",
        "key (field value)...",
    ),
    spec(
        "hmset",
        -4,
        Write,
        W_OOM_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Set multiple hash fields to multiple values",
        "key (field value)...",
    ),
    spec(
        "hsetnx",
        4,
        Write,
        W_OOM_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Set the value of a hash field, only if the field does not exist",
        "key field value",
    ),
    spec(
        "hget",
        3,
        Read,
        RO_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Get the value of a hash field",
        "key field",
    ),
    spec(
        "hmget",
        -3,
        Read,
        RO_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Get the values of all the given hash fields",
        "key field...",
    ),
    spec(
        "hdel",
        -3,
        Write,
        W_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Delete one or more hash fields",
        "key field...",
    ),
    spec(
        "hexists",
        3,
        Read,
        RO_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Determine if a hash field exists",
        "key field",
    ),
    spec(
        "hlen",
        2,
        Read,
        RO_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Get the number of fields in a hash",
        "key",
    ),
    spec(
        "hgetall",
        2,
        Read,
        RO,
        ONE,
        "hash",
        "2.0.0",
        "Get all the fields and values in a hash",
        "key",
    ),
    spec(
        "hkeys",
        2,
        Read,
        RO,
        ONE,
        "hash",
        "2.0.0",
        "Get all the fields in a hash",
        "key",
    ),
    spec(
        "hvals",
        2,
        Read,
        RO,
        ONE,
        "hash",
        "2.0.0",
        "Get all the values in a hash",
        "key",
    ),
    spec(
        "hincrby",
        4,
        Write,
        W_OOM_FAST,
        ONE,
        "hash",
        "2.0.0",
        "Increment the integer value of a hash field by the given number",
        "key field increment",
    ),
    spec(
        "hincrbyfloat",
        4,
        Write,
        W_OOM_FAST,
        ONE,
        "hash",
        "2.6.0",
        "Increment the float value of a hash field by the given amount",
        "key field increment",
    ),
    spec(
        "hscan",
        -3,
        Read,
        RO,
        ONE,
        "hash",
        "2.8.0",
        "Incrementally iterate hash fields and associated values",
        "key cursor [MATCH pattern] [COUNT count]",
    ),
    spec(
        "hstrlen",
        3,
        Read,
        RO_FAST,
        ONE,
        "hash",
        "3.2.0",
        "Get the length of the value of a hash field",
        "key field",
    ),
    // Transactions.
    spec(
        "multi",
        1,
        Local,
        TX,
        NONE,
        "transactions",
        "1.2.0",
        "Mark the start of a transaction block",
        "",
    ),
    spec(
        "exec",
        1,
        Local,
        &["noscript", "loading", "stale", "skip_slowlog"],
        NONE,
        "transactions",
        "1.2.0",
        "Execute all commands issued after MULTI",
        "",
    ),
    spec(
        "discard",
        1,
        Local,
        TX,
        NONE,
        "transactions",
        "2.0.0",
        "Discard all commands issued after MULTI",
        "",
    ),
    spec(
        "watch",
        -2,
        Local,
        TX,
        ALL_KEYS,
        "transactions",
        "2.2.0",
        "Watch the given keys to determine execution of the MULTI/EXEC block",
        "key...",
    ),
    spec(
        "unwatch",
        1,
        Local,
        TX,
        NONE,
        "transactions",
        "2.2.0",
        "Forget about all watched keys",
        "",
    ),
    // Connection.
    spec(
        "ping",
        -1,
        Local,
        &["fast"],
        NONE,
        "connection",
        "1.0.0",
        "Ping the server",
        "[message]",
    ),
    spec(
        "echo",
        2,
        Local,
        &["fast"],
        NONE,
        "connection",
        "1.0.0",
        "Echo the given string",
        "message",
    ),
    spec(
        "quit",
        -1,
        Local,
        &[
            "allow_busy",
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
        ],
        NONE,
        "connection",
        "1.0.0",
        "Close the connection",
        "",
    ),
    spec(
        "reset",
        1,
        Local,
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        NONE,
        "connection",
        "6.2.0",
        "Reset the connection",
        "",
    ),
    spec(
        "select",
        2,
        Local,
        &["loading", "stale", "fast"],
        NONE,
        "connection",
        "1.0.0",
        "Change the selected database for the current connection",
        "index",
    ),
    spec(
        "auth",
        -2,
        Local,
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        NONE,
        "connection",
        "1.0.0",
        "Authenticate to the server",
        "[username] password",
    ),
    spec(
        "hello",
        -1,
        Local,
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        NONE,
        "connection",
        "6.0.0",
        "Handshake with Redis",
        "[protover [AUTH username password] [SETNAME clientname]]",
    ),
    Spec {
        subcommands: CLIENT,
        ..spec(
            "client",
            -2,
            Local,
            &[],
            NONE,
            "connection",
            "2.4.0",
            "A container for client connection commands",
            "",
        )
    },
    spec(
        "readonly",
        1,
        Local,
        &["loading", "stale", "fast"],
        NONE,
        "cluster",
        "3.0.0",
        "Enables read queries for a connection to a cluster replica node (raftcask: stale reads from this member)",
        "",
    ),
    spec(
        "readwrite",
        1,
        Local,
        &["loading", "stale", "fast"],
        NONE,
        "cluster",
        "3.0.0",
        "Disables read queries for a connection to a cluster replica node (raftcask: linearizable reads again)",
        "",
    ),
    // Server.
    spec(
        "info",
        -1,
        Local,
        &["loading", "stale"],
        NONE,
        "server",
        "1.0.0",
        "Get information and statistics about the server",
        "[section...]",
    ),
    spec(
        "time",
        1,
        Local,
        &["loading", "stale", "fast"],
        NONE,
        "server",
        "2.6.0",
        "Return the current server time",
        "",
    ),
    spec(
        "wait",
        3,
        Local,
        &["noscript"],
        NONE,
        "generic",
        "3.0.0",
        "Wait for the synchronous replication of all the write commands sent in the context of the current connection",
        "numreplicas timeout",
    ),
    Spec {
        subcommands: COMMAND,
        ..spec(
            "command",
            -1,
            Local,
            &["loading", "stale"],
            NONE,
            "server",
            "2.8.13",
            "Get array of Redis command details",
            "",
        )
    },
    Spec {
        subcommands: CONFIG,
        ..spec(
            "config",
            -2,
            Local,
            &[],
            NONE,
            "server",
            "2.0.0",
            "A container for server configuration commands",
            "",
        )
    },
];

/// The command named `name` (any case).
pub fn lookup(name: &[u8]) -> Option<&'static Spec> {
    let name = name.to_ascii_lowercase();
    COMMANDS.iter().find(|spec| spec.name.as_bytes() == name)
}

/// The subcommand of `container` named `name` (any case).
pub fn subcommand(container: &'static Spec, name: &[u8]) -> Option<&'static Spec> {
    let name = name.to_ascii_lowercase();
    container
        .subcommands
        .iter()
        .find(|spec| spec.name.as_bytes() == name)
}

/// `-ERR wrong number of arguments` when `argc` does not fit `spec`'s
/// arity (`full_name`: `get`, or `client|setname` for a subcommand).
pub fn check_arity(spec: &Spec, argc: usize, full_name: &str) -> Result<(), Reply> {
    let argc = argc as i64;
    let fits = if spec.arity >= 0 {
        argc == spec.arity
    } else {
        argc >= -spec.arity
    };
    if fits {
        Ok(())
    } else {
        Err(Reply::err(format!(
            "wrong number of arguments for '{full_name}' command"
        )))
    }
}

/// Redis's answer to a command it does not know.
pub fn unknown_command(args: &[Vec<u8>]) -> Reply {
    let name = args
        .first()
        .map(|n| lossy_prefix(n, 128))
        .unwrap_or_default();
    let mut rest = String::new();
    for arg in args.iter().skip(1) {
        if rest.len() >= 128 {
            break;
        }
        let room = 128 - rest.len();
        rest.push_str(&format!("'{}' ", lossy_prefix(arg, room)));
    }
    Reply::err(format!(
        "unknown command '{name}', with args beginning with: {rest}"
    ))
}

/// Redis's answer to a subcommand it does not know.
pub fn unknown_subcommand(container: &str, name: &[u8]) -> Reply {
    Reply::err(format!(
        "unknown subcommand '{}'. Try {} HELP.",
        lossy_prefix(name, 128),
        container.to_ascii_uppercase()
    ))
}

/// At most `max` bytes of `bytes` as text (`%.*s`).
fn lossy_prefix(bytes: &[u8], max: usize) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(max)]).into_owned()
}

/// Commands and subcommands the table holds (`COMMAND COUNT` counts the
/// top-level ones, as Redis does).
pub fn count() -> usize {
    COMMANDS.len()
}

fn status_set(items: impl IntoIterator<Item = String>) -> Reply {
    Reply::Set(items.into_iter().map(Reply::Simple).collect())
}

/// ACL categories as Redis derives them from a command's flags and group.
fn categories(spec: &Spec) -> Vec<String> {
    let mut categories = Vec::new();
    if spec.flags.contains(&"write") {
        categories.push("@write".to_string());
    }
    if spec.flags.contains(&"readonly") {
        categories.push("@read".to_string());
    }
    let group = match spec.group {
        "generic" => "keyspace",
        "transactions" => "transaction",
        "server" | "cluster" => "admin",
        other => other,
    };
    categories.push(format!("@{group}"));
    categories.push(if spec.flags.contains(&"fast") {
        "@fast".to_string()
    } else {
        "@slow".to_string()
    });
    categories
}

/// `COMMAND INFO`'s entry for one command (`full_name` for a subcommand).
fn info(spec: &Spec, full_name: &str) -> Reply {
    Reply::Array(vec![
        Reply::text(full_name),
        Reply::Integer(spec.arity),
        status_set(spec.flags.iter().map(|f| f.to_string())),
        Reply::Integer(spec.keys.0),
        Reply::Integer(spec.keys.1),
        Reply::Integer(spec.keys.2),
        status_set(categories(spec)),
        Reply::Set(Vec::new()),
        Reply::Array(Vec::new()),
        Reply::Array(
            spec.subcommands
                .iter()
                .map(|sub| info(sub, &format!("{full_name}|{}", sub.name)))
                .collect(),
        ),
    ])
}

/// `COMMAND DOCS`'s entry for one command.
fn docs(spec: &Spec, full_name: &str) -> Reply {
    let mut pairs = vec![
        (Reply::text("summary"), Reply::text(spec.summary)),
        (Reply::text("since"), Reply::text(spec.since)),
        (Reply::text("group"), Reply::text(spec.group)),
    ];
    let arguments = parse_arguments(spec.arguments);
    if !arguments.is_empty() {
        pairs.push((
            Reply::text("arguments"),
            Reply::Array(arguments.iter().map(Argument::reply).collect()),
        ));
    }
    if !spec.subcommands.is_empty() {
        pairs.push((
            Reply::text("subcommands"),
            Reply::Map(
                spec.subcommands
                    .iter()
                    .map(|sub| {
                        let name = format!("{full_name}|{}", sub.name);
                        (Reply::text(name.clone()), docs(sub, &name))
                    })
                    .collect(),
            ),
        ));
    }
    Reply::Map(pairs)
}

/// One documented argument (`COMMAND DOCS`'s `arguments`).
#[derive(Debug, Clone, PartialEq)]
struct Argument {
    name: String,
    kind: &'static str,
    token: Option<String>,
    optional: bool,
    multiple: bool,
    arguments: Vec<Argument>,
}

impl Argument {
    fn reply(&self) -> Reply {
        let mut pairs = vec![
            (Reply::text("name"), Reply::text(self.name.clone())),
            (Reply::text("type"), Reply::text(self.kind)),
        ];
        if let Some(token) = &self.token {
            pairs.push((Reply::text("token"), Reply::text(token.clone())));
        }
        let mut flags = Vec::new();
        if self.optional {
            flags.push("optional".to_string());
        }
        if self.multiple {
            flags.push("multiple".to_string());
        }
        if !flags.is_empty() {
            pairs.push((Reply::text("flags"), status_set(flags)));
        }
        if !self.arguments.is_empty() {
            pairs.push((
                Reply::text("arguments"),
                Reply::Array(self.arguments.iter().map(Argument::reply).collect()),
            ));
        }
        Reply::Map(pairs)
    }
}

/// The type of a plain argument, from its name.
fn kind_of(name: &str) -> &'static str {
    match name {
        "key" | "newkey" | "destination" => "key",
        "pattern" => "pattern",
        "seconds" | "milliseconds" | "decrement" | "offset" | "start" | "end" | "index"
        | "numreplicas" | "timeout" | "count" | "cursor" | "protover" | "client-id" => "integer",
        "increment" => "string",
        name if name.starts_with("unix-time") => "unix-time",
        _ => "string",
    }
}

fn is_token(word: &str) -> bool {
    word.bytes().any(|b| b.is_ascii_uppercase())
        && word
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'-' || b.is_ascii_digit())
}

/// Parses the argument notation of [`Spec::arguments`].
fn parse_arguments(text: &str) -> Vec<Argument> {
    // Tokens: brackets, parentheses, bars and words (a `...` suffix kept
    // on its word or closing bracket).
    let mut tokens = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        match c {
            '[' | ']' | '(' | ')' | '|' | ' ' => {
                if !word.is_empty() {
                    tokens.push(std::mem::take(&mut word));
                }
                if c != ' ' {
                    tokens.push(c.to_string());
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        tokens.push(word);
    }
    let mut position = 0;
    parse_sequence(&tokens, &mut position)
}

/// A sequence up to a closing `]` or `)` (or the end), its `|`
/// alternatives made into one `oneof` argument.
fn parse_sequence(tokens: &[String], position: &mut usize) -> Vec<Argument> {
    let mut alternatives: Vec<Vec<Argument>> = vec![Vec::new()];
    while *position < tokens.len() {
        let token = tokens[*position].as_str();
        match token {
            "]" | ")" => break,
            "|" => {
                *position += 1;
                alternatives.push(Vec::new());
            }
            "[" | "(" => {
                *position += 1;
                let inner = parse_sequence(tokens, position);
                // The closing bracket, maybe followed by `...` as a word.
                *position += 1;
                let multiple = tokens.get(*position).is_some_and(|t| t == "...");
                if multiple {
                    *position += 1;
                }
                let mut argument = if inner.len() == 1 {
                    inner
                        .into_iter()
                        .next()
                        .unwrap_or_else(|| block(Vec::new()))
                } else {
                    block(inner)
                };
                argument.optional |= token == "[";
                argument.multiple |= multiple;
                if let Some(current) = alternatives.last_mut() {
                    current.push(argument);
                }
            }
            word => {
                *position += 1;
                let (word, multiple) = match word.strip_suffix("...") {
                    Some(stem) => (stem, true),
                    None => (word, false),
                };
                let argument = if is_token(word) {
                    // `TOKEN name`: a named argument after its token.
                    match tokens.get(*position).map(String::as_str) {
                        Some(next)
                            if !is_token(next) && !["[", "]", "(", ")", "|"].contains(&next) =>
                        {
                            *position += 1;
                            let (name, repeats) = match next.strip_suffix("...") {
                                Some(stem) => (stem, true),
                                None => (next, false),
                            };
                            Argument {
                                name: name.to_string(),
                                kind: kind_of(name),
                                token: Some(word.to_string()),
                                optional: false,
                                multiple: multiple || repeats,
                                arguments: Vec::new(),
                            }
                        }
                        _ => Argument {
                            name: word.to_ascii_lowercase(),
                            kind: "pure-token",
                            token: Some(word.to_string()),
                            optional: false,
                            multiple,
                            arguments: Vec::new(),
                        },
                    }
                } else {
                    Argument {
                        name: word.to_string(),
                        kind: kind_of(word),
                        token: None,
                        optional: false,
                        multiple,
                        arguments: Vec::new(),
                    }
                };
                if let Some(current) = alternatives.last_mut() {
                    current.push(argument);
                }
            }
        }
    }
    if alternatives.len() == 1 {
        return alternatives.pop().unwrap_or_default();
    }
    let choices = alternatives
        .into_iter()
        .map(|alternative| {
            if alternative.len() == 1 {
                alternative
                    .into_iter()
                    .next()
                    .unwrap_or_else(|| block(Vec::new()))
            } else {
                block(alternative)
            }
        })
        .collect::<Vec<_>>();
    let name = choices
        .iter()
        .map(|c| c.name.clone())
        .collect::<Vec<_>>()
        .join("-");
    vec![Argument {
        name,
        kind: "oneof",
        token: None,
        optional: false,
        multiple: false,
        arguments: choices,
    }]
}

fn block(arguments: Vec<Argument>) -> Argument {
    let name = arguments
        .iter()
        .map(|a| a.name.clone())
        .collect::<Vec<_>>()
        .join("-");
    Argument {
        name: if name.is_empty() {
            "block".into()
        } else {
            name
        },
        kind: "block",
        token: None,
        optional: false,
        multiple: false,
        arguments,
    }
}

/// COMMAND and its subcommands (`args` from the subcommand on; empty for
/// plain COMMAND).
pub fn command(args: &[Vec<u8>]) -> Reply {
    let Some(sub) = args.first() else {
        return Reply::Array(COMMANDS.iter().map(|spec| info(spec, spec.name)).collect());
    };
    let names = || args[1..].iter().map(|n| n.to_ascii_lowercase());
    match sub.to_ascii_lowercase().as_slice() {
        b"count" => Reply::Integer(count() as i64),
        b"list" => Reply::Array(COMMANDS.iter().map(|s| Reply::text(s.name)).collect()),
        b"info" if args.len() == 1 => {
            Reply::Array(COMMANDS.iter().map(|spec| info(spec, spec.name)).collect())
        }
        b"info" => Reply::Array(
            names()
                .map(|name| match lookup(&name) {
                    Some(spec) => info(spec, spec.name),
                    None => Reply::NilArray,
                })
                .collect(),
        ),
        b"docs" if args.len() == 1 => Reply::Map(
            COMMANDS
                .iter()
                .map(|spec| (Reply::text(spec.name), docs(spec, spec.name)))
                .collect(),
        ),
        b"docs" => Reply::Map(
            names()
                .filter_map(|name| lookup(&name))
                .map(|spec| (Reply::text(spec.name), docs(spec, spec.name)))
                .collect(),
        ),
        b"help" => Reply::Array(
            [
                "COMMAND <subcommand> [<arg> [value] [opt] ...]. Subcommands are:",
                "(no subcommand)",
                "    Return details about all Redis commands.",
                "COUNT",
                "    Return the total number of commands in this Redis server.",
                "LIST",
                "    Return a list of all commands in this Redis server.",
                "INFO [<command-name> ...]",
                "    Return details about multiple Redis commands.",
                "DOCS [<command-name> ...]",
                "    Return documentation details about multiple Redis commands.",
                "HELP",
                "    Print this help.",
            ]
            .into_iter()
            .map(|line| Reply::Simple(line.to_string()))
            .collect(),
        ),
        _ => unknown_subcommand("command", sub),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arity_and_unknown_commands_answer_as_redis() {
        let get = lookup(b"GET").unwrap();
        assert!(check_arity(get, 2, "get").is_ok());
        assert_eq!(
            check_arity(get, 1, "get").unwrap_err(),
            Reply::err("wrong number of arguments for 'get' command")
        );
        let set = lookup(b"set").unwrap();
        assert!(check_arity(set, 5, "set").is_ok());
        assert!(check_arity(set, 2, "set").is_err());
        assert_eq!(
            unknown_command(&[b"foo".to_vec(), b"a".to_vec(), b"b".to_vec()]),
            Reply::err("unknown command 'foo', with args beginning with: 'a' 'b' ")
        );
        assert_eq!(
            unknown_subcommand("client", b"foo"),
            Reply::err("unknown subcommand 'foo'. Try CLIENT HELP.")
        );
    }

    #[test]
    fn every_command_documents_its_arguments() {
        for spec in COMMANDS {
            for argument in parse_arguments(spec.arguments) {
                assert!(!argument.name.is_empty(), "{}", spec.name);
            }
        }
        let set = parse_arguments(lookup(b"set").unwrap().arguments);
        assert_eq!(set[0].name, "key");
        assert_eq!(set[0].kind, "key");
        assert_eq!(set[2].kind, "oneof");
        assert!(set[2].optional);
        assert_eq!(set[3].kind, "pure-token");
        assert_eq!(set[4].arguments[0].token.as_deref(), Some("EX"));
        assert_eq!(set[4].arguments[0].name, "seconds");
        let mset = parse_arguments(lookup(b"mset").unwrap().arguments);
        assert_eq!(mset.len(), 1);
        assert_eq!(mset[0].kind, "block");
        assert!(mset[0].multiple);
        let del = parse_arguments(lookup(b"del").unwrap().arguments);
        assert!(del[0].multiple);
    }
}
