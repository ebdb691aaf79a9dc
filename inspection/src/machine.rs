//! The introspection state machine, compatible with ironic-inspector.
//!
//! A node never inspected counts as `finished`. `wait` is *reentrant*: its event fires after its task, and meeting
//! it again is harmless. `process`, `abort` and `reapply` are *strict*: the event fires before the task, and a
//! worker that meets the same strict transition again (it died after the task, before consuming the request — the
//! "déjà vu") must not repeat the task: the node goes to `error` instead.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where an inspection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    Starting,
    Waiting,
    Processing,
    Finished,
    Error,
    Reapplying,
    Aborting,
    Enrolling,
}

/// What happens to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    Start,
    Wait,
    Process,
    Finish,
    Error,
    Timeout,
    Abort,
    AbortEnd,
    Reapply,
}

impl State {
    pub const ALL: [State; 8] = [
        State::Starting,
        State::Waiting,
        State::Processing,
        State::Finished,
        State::Error,
        State::Reapplying,
        State::Aborting,
        State::Enrolling,
    ];

    /// No worker is acting on a node in this state: a new request may start.
    pub fn is_stable(self) -> bool {
        matches!(self, State::Finished | State::Error | State::Waiting)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Waiting => "waiting",
            State::Processing => "processing",
            State::Finished => "finished",
            State::Error => "error",
            State::Reapplying => "reapplying",
            State::Aborting => "aborting",
            State::Enrolling => "enrolling",
        }
    }
}

impl Event {
    pub const ALL: [Event; 9] = [
        Event::Start,
        Event::Wait,
        Event::Process,
        Event::Finish,
        Event::Error,
        Event::Timeout,
        Event::Abort,
        Event::AbortEnd,
        Event::Reapply,
    ];

    /// Strict events fire before their task; meeting one twice means a worker died mid-task.
    pub fn is_strict(self) -> bool {
        matches!(self, Event::Process | Event::Abort | Event::Reapply)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Event::Start => "start",
            Event::Wait => "wait",
            Event::Process => "process",
            Event::Finish => "finish",
            Event::Error => "error",
            Event::Timeout => "timeout",
            Event::Abort => "abort",
            Event::AbortEnd => "abort_end",
            Event::Reapply => "reapply",
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        State::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("unknown introspection state {:?}", crate::clip(s, 64)))
    }
}

/// The transition table (from, event) -> to.
pub fn next(from: State, event: Event) -> Option<State> {
    use Event as E;
    use State as S;
    Some(match (from, event) {
        (S::Starting, E::Wait) => S::Waiting,
        (S::Starting, E::Error) | (S::Starting, E::Timeout) => S::Error,
        (S::Waiting, E::Process) => S::Processing,
        (S::Waiting, E::Abort) => S::Aborting,
        (S::Waiting, E::Start) => S::Starting,
        (S::Waiting, E::Timeout) => S::Error,
        (S::Processing, E::Finish) => S::Finished,
        (S::Processing, E::Error) | (S::Processing, E::Timeout) => S::Error,
        (S::Finished, E::Start) => S::Starting,
        (S::Finished, E::Reapply) => S::Reapplying,
        (S::Finished, E::Finish) => S::Finished,
        (S::Error, E::Start) => S::Starting,
        (S::Error, E::Reapply) => S::Reapplying,
        (S::Error, E::Abort) | (S::Error, E::Error) => S::Error,
        (S::Reapplying, E::Finish) => S::Finished,
        (S::Reapplying, E::Reapply) => S::Reapplying,
        (S::Reapplying, E::Error) | (S::Reapplying, E::Timeout) => S::Error,
        (S::Aborting, E::AbortEnd) | (S::Aborting, E::Timeout) => S::Error,
        (S::Enrolling, E::Process) => S::Processing,
        (S::Enrolling, E::Error) | (S::Enrolling, E::Timeout) => S::Error,
        _ => return None,
    })
}

/// An event that is not allowed in a state. Nothing changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("event {event} is not allowed in state {from} (allowed: {})", allowed(*from).iter().map(|e| e.as_str()).collect::<Vec<_>>().join(", "))]
pub struct IllegalTransition {
    pub from: State,
    pub event: Event,
}

/// The events allowed in a state.
pub fn allowed(from: State) -> Vec<Event> {
    Event::ALL.into_iter().filter(|e| next(from, *e).is_some()).collect()
}

/// Advances `from` by `event`.
pub fn advance(from: State, event: Event) -> Result<State, IllegalTransition> {
    next(from, event).ok_or(IllegalTransition { from, event })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table of the issue, written out independently of `next`: every legal (from, event, to).
    const LEGAL: &[(State, Event, State)] = &[
        (State::Starting, Event::Wait, State::Waiting),
        (State::Starting, Event::Error, State::Error),
        (State::Starting, Event::Timeout, State::Error),
        (State::Waiting, Event::Process, State::Processing),
        (State::Waiting, Event::Abort, State::Aborting),
        (State::Waiting, Event::Start, State::Starting),
        (State::Waiting, Event::Timeout, State::Error),
        (State::Processing, Event::Finish, State::Finished),
        (State::Processing, Event::Error, State::Error),
        (State::Processing, Event::Timeout, State::Error),
        (State::Finished, Event::Start, State::Starting),
        (State::Finished, Event::Reapply, State::Reapplying),
        (State::Finished, Event::Finish, State::Finished),
        (State::Error, Event::Start, State::Starting),
        (State::Error, Event::Reapply, State::Reapplying),
        (State::Error, Event::Abort, State::Error),
        (State::Error, Event::Error, State::Error),
        (State::Reapplying, Event::Finish, State::Finished),
        (State::Reapplying, Event::Reapply, State::Reapplying),
        (State::Reapplying, Event::Error, State::Error),
        (State::Reapplying, Event::Timeout, State::Error),
        (State::Aborting, Event::AbortEnd, State::Error),
        (State::Aborting, Event::Timeout, State::Error),
        (State::Enrolling, Event::Process, State::Processing),
        (State::Enrolling, Event::Error, State::Error),
        (State::Enrolling, Event::Timeout, State::Error),
    ];

    #[test]
    fn every_state_event_pair() {
        let mut legal = 0;
        for from in State::ALL {
            for event in Event::ALL {
                let want = LEGAL.iter().find(|(f, e, _)| *f == from && *e == event).map(|(_, _, t)| *t);
                match (advance(from, event), want) {
                    (Ok(to), Some(w)) => {
                        assert_eq!(to, w, "{from} --{event}-->");
                        legal += 1;
                    }
                    (Err(err), None) => {
                        assert_eq!(err, IllegalTransition { from, event });
                        let msg = err.to_string();
                        assert!(msg.contains(from.as_str()) && msg.contains(event.as_str()), "{msg}");
                    }
                    (got, want) => panic!("{from} --{event}--> got {got:?}, want {want:?}"),
                }
            }
        }
        assert_eq!(legal, LEGAL.len());
        assert_eq!(State::ALL.len() * Event::ALL.len(), 72);
    }

    #[test]
    fn strictness() {
        let strict: Vec<Event> = Event::ALL.into_iter().filter(|e| e.is_strict()).collect();
        assert_eq!(strict, vec![Event::Process, Event::Abort, Event::Reapply]);
        assert!(!Event::Wait.is_strict());
    }

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
            assert_eq!(serde_json::to_string(&s).unwrap(), format!("\"{}\"", s.as_str()));
        }
        for e in Event::ALL {
            assert_eq!(serde_json::to_string(&e).unwrap(), format!("\"{}\"", e.as_str()));
        }
        assert!("bogus".parse::<State>().is_err());
    }
}
