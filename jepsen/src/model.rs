//! The sequential specifications the linearizability checker tests against:
//! [`CasRegister`] (Jepsen's etcd register), [`Kv`] (get / put / append on
//! one key) and [`Register`] (raftcask's register: read / write /
//! compare-and-set by version, versions returned by writes).
//!
//! A model sees one key at a time (keys are independent). Values are
//! interned to small integers per key so states hash quickly.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;

use crate::Error;
use crate::history::{Function, Operation, Outcome};

/// Interns a key's values as small integers.
#[derive(Debug, Default)]
pub struct Interner {
    ids: HashMap<String, u32>,
}

impl Interner {
    /// The id of `value` (`None` stays `None`: nil / absent).
    pub fn id(&mut self, value: Option<&str>) -> Option<u32> {
        let value = value?;
        let next = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
        Some(*self.ids.entry(value.to_string()).or_insert(next))
    }
}

/// A sequential specification.
pub trait Model: Sync {
    /// The state of one key.
    type State: Clone + Eq + Hash + Send + Debug;
    /// An operation, prepared for [`Model::step`].
    type Input: Send + Sync + Debug;
    /// Scratch a search keeps for the model (e.g. interned states).
    type Context: Default;

    /// The model's name (as on the command line).
    fn name(&self) -> &'static str;

    /// The state of a key nobody wrote.
    fn init(&self) -> Self::State;

    /// Prepares an ok or unknown operation (failed operations and reads of
    /// unknown outcome never reach here: they constrain nothing). `None`
    /// drops the operation; an error names the operation and field.
    fn prepare(
        &self,
        operation: &Operation,
        values: &mut Interner,
    ) -> Result<Option<Self::Input>, Error>;

    /// The states after applying `input` to `state` as the operation
    /// completed (for an ok operation: its result must match); none if it
    /// cannot apply. The checker itself adds "no effect" for operations of
    /// unknown outcome.
    fn step(
        &self,
        context: &mut Self::Context,
        state: &Self::State,
        input: &Self::Input,
        next: &mut Vec<Self::State>,
    );
}

fn unsupported(model: &str, operation: &Operation) -> Error {
    Error::Model {
        operation: operation.id,
        reason: format!(
            "function {:?} is not part of the {model} model",
            operation.f
        ),
    }
}

fn missing(operation: &Operation, field: &str) -> Error {
    Error::Model {
        operation: operation.id,
        reason: format!("{:?} needs the field `{field}`", operation.f),
    }
}

/// Jepsen's compare-and-set register: read / write / cas, starting empty.
#[derive(Debug, Clone, Copy, Default)]
pub struct CasRegister;

/// An operation of the [`CasRegister`].
#[derive(Debug, Clone, Copy)]
pub enum CasRegisterInput {
    /// Read this value (`None` = nothing written yet).
    Read(Option<u32>),
    /// Write this value.
    Write(u32),
    /// If the value is `.0`, set it to `.1`.
    Cas(u32, u32),
}

impl Model for CasRegister {
    type State = Option<u32>;
    type Input = CasRegisterInput;
    type Context = ();

    fn name(&self) -> &'static str {
        "cas-register"
    }

    fn init(&self) -> Self::State {
        None
    }

    fn prepare(
        &self,
        operation: &Operation,
        values: &mut Interner,
    ) -> Result<Option<Self::Input>, Error> {
        let value = values.id(operation.value.as_deref());
        Ok(Some(match operation.f {
            Function::Read => CasRegisterInput::Read(value),
            Function::Write => {
                CasRegisterInput::Write(value.ok_or_else(|| missing(operation, "value"))?)
            }
            Function::Cas => CasRegisterInput::Cas(
                values
                    .id(operation.expected.as_deref())
                    .ok_or_else(|| missing(operation, "expected"))?,
                value.ok_or_else(|| missing(operation, "value"))?,
            ),
            _ => return Err(unsupported(self.name(), operation)),
        }))
    }

    fn step(
        &self,
        _context: &mut Self::Context,
        state: &Self::State,
        input: &Self::Input,
        next: &mut Vec<Self::State>,
    ) {
        match *input {
            CasRegisterInput::Read(value) if value == *state => next.push(*state),
            CasRegisterInput::Read(_) => {}
            CasRegisterInput::Write(value) => next.push(Some(value)),
            CasRegisterInput::Cas(from, to) if *state == Some(from) => next.push(Some(to)),
            CasRegisterInput::Cas(..) => {}
        }
    }
}

/// One key of a string map: get / put / append; a missing key reads as "".
///
/// A state is a node of a trie of appends ([`KvStates`]): put starts a new
/// branch at the root, append adds a child. States stay 4 bytes however
/// long the value grows; two nodes may spell the same string, which only
/// costs memoization, never correctness.
#[derive(Debug, Clone, Copy, Default)]
pub struct Kv;

/// The trie of a [`Kv`] search: node 0 is the empty string.
#[derive(Debug)]
pub struct KvStates {
    /// (parent, text appended, total length) per node.
    nodes: Vec<(u32, String, usize)>,
    children: HashMap<(u32, String), u32>,
    spelled: String,
}

impl Default for KvStates {
    fn default() -> Self {
        KvStates {
            nodes: vec![(0, String::new(), 0)],
            children: HashMap::new(),
            spelled: String::new(),
        }
    }
}

impl KvStates {
    fn child(&mut self, parent: u32, text: &str) -> u32 {
        if let Some(&id) = self.children.get(&(parent, text.to_string())) {
            return id;
        }
        let length = self.nodes[parent as usize].2 + text.len();
        let id = u32::try_from(self.nodes.len()).unwrap_or(u32::MAX);
        self.nodes.push((parent, text.to_string(), length));
        self.children.insert((parent, text.to_string()), id);
        id
    }

    fn equals(&mut self, node: u32, value: &str) -> bool {
        if self.nodes[node as usize].2 != value.len() {
            return false;
        }
        let mut pieces = Vec::new();
        let mut at = node;
        while at != 0 {
            let (parent, text, _) = &self.nodes[at as usize];
            pieces.push(text.as_str());
            at = *parent;
        }
        self.spelled.clear();
        for piece in pieces.iter().rev() {
            self.spelled.push_str(piece);
        }
        self.spelled == value
    }
}

/// An operation of the [`Kv`] model.
#[derive(Debug, Clone)]
pub enum KvInput {
    /// Read this value.
    Get(String),
    /// Set the value.
    Put(String),
    /// Append to the value.
    Append(String),
}

impl Model for Kv {
    type State = u32;
    type Input = KvInput;
    type Context = KvStates;

    fn name(&self) -> &'static str {
        "kv"
    }

    fn init(&self) -> Self::State {
        0
    }

    fn prepare(
        &self,
        operation: &Operation,
        _values: &mut Interner,
    ) -> Result<Option<Self::Input>, Error> {
        let value = operation.value.clone();
        Ok(Some(match operation.f {
            Function::Get => KvInput::Get(value.unwrap_or_default()),
            Function::Put => KvInput::Put(value.ok_or_else(|| missing(operation, "value"))?),
            Function::Append => KvInput::Append(value.ok_or_else(|| missing(operation, "value"))?),
            _ => return Err(unsupported(self.name(), operation)),
        }))
    }

    fn step(
        &self,
        context: &mut Self::Context,
        state: &Self::State,
        input: &Self::Input,
        next: &mut Vec<Self::State>,
    ) {
        match input {
            KvInput::Get(value) => {
                if context.equals(*state, value) {
                    next.push(*state);
                }
            }
            KvInput::Put(value) => next.push(context.child(0, value)),
            KvInput::Append(value) => next.push(context.child(*state, value)),
        }
    }
}

/// raftcask's register: read returns value and version, write returns the new
/// version, compare-and-set applies only if the key's version is
/// `expected_version` (0 = absent). Versions increase with every applied write.
#[derive(Debug, Clone, Copy, Default)]
pub struct Register;

/// The state of one raftcask key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RegisterState {
    /// The value (`None` = absent).
    pub value: Option<u32>,
    /// The version; `None` = written by an operation of unknown outcome whose
    /// version nobody has read yet.
    pub version: Option<u64>,
}

/// An operation of the [`Register`] model.
#[derive(Debug, Clone, Copy)]
pub enum RegisterInput {
    /// Read a value (`None` = absent) at a version (`None` = not recorded).
    Read(Option<u32>, Option<u64>),
    /// Write a value; the version it got (`None` = unknown outcome).
    Write(u32, Option<u64>),
    /// If the version is `.0`, write `.1`; the version it got.
    Cas(u64, u32, Option<u64>),
}

impl Model for Register {
    type State = RegisterState;
    type Input = RegisterInput;
    type Context = ();

    fn name(&self) -> &'static str {
        "register"
    }

    fn init(&self) -> Self::State {
        RegisterState {
            value: None,
            version: Some(0),
        }
    }

    fn prepare(
        &self,
        operation: &Operation,
        values: &mut Interner,
    ) -> Result<Option<Self::Input>, Error> {
        let value = values.id(operation.value.as_deref());
        // Histories recorded since revisions compare in mod_revision space:
        // an ok write carries the revision it applied at (the key's new
        // mod_revision), an ok read the mod_revision it found (none: absent,
        // 0), and a cas the mod_revision it required. Older histories
        // compare sequence numbers (`version`, `expected_version`).
        let version = match operation.outcome {
            Outcome::Ok if operation.revision.is_some() => match operation.f {
                Function::Read | Function::Get => Some(operation.mod_revision.unwrap_or(0)),
                _ => operation.revision,
            },
            Outcome::Ok => operation.version,
            _ => None,
        };
        Ok(Some(match operation.f {
            Function::Read | Function::Get => RegisterInput::Read(value, version),
            Function::Write | Function::Put => {
                RegisterInput::Write(value.ok_or_else(|| missing(operation, "value"))?, version)
            }
            Function::Cas => RegisterInput::Cas(
                operation
                    .expected_mod_revision
                    .or(operation.expected_version)
                    .ok_or_else(|| missing(operation, "expected_version"))?,
                value.ok_or_else(|| missing(operation, "value"))?,
                version,
            ),
            _ => return Err(unsupported(self.name(), operation)),
        }))
    }

    fn step(
        &self,
        _context: &mut Self::Context,
        state: &Self::State,
        input: &Self::Input,
        next: &mut Vec<Self::State>,
    ) {
        match *input {
            RegisterInput::Read(value, version) => {
                if value != state.value {
                    return;
                }
                match (state.version, version) {
                    (Some(current), Some(read)) if current != read => {}
                    // A read learns the version of an unknown-outcome write.
                    (None, Some(read)) => next.push(RegisterState {
                        value: state.value,
                        version: Some(read),
                    }),
                    _ => next.push(*state),
                }
            }
            RegisterInput::Write(value, version) => {
                if let (Some(current), Some(written)) = (state.version, version)
                    && written <= current
                {
                    return;
                }
                next.push(RegisterState {
                    value: Some(value),
                    version,
                });
            }
            RegisterInput::Cas(expected, value, version) => {
                if state.version.is_some_and(|current| current != expected) {
                    return;
                }
                if version.is_some_and(|written| written <= expected) {
                    return;
                }
                next.push(RegisterState {
                    value: Some(value),
                    version,
                });
            }
        }
    }
}
