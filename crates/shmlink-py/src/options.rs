//! `**options` keyword arguments into shmlink's option builders.

use std::time::Duration;

use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use shmlink::{Options, Pem, Policy, PubSubOptions, TlsOptions, WaitPolicy};

/// How long to keep retrying before sleeping: the connection's wait policy.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spin {
    /// Retries with the CPU's pause hint in between.
    pub(crate) spin: Duration,
    /// Then retries with `sched_yield` in between.
    pub(crate) yield_: Duration,
}

/// A duration given in seconds as a Python number.
pub(crate) fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value).map_err(|_| {
        PyValueError::new_err(format!(
            "{name} must be a finite number of seconds >= 0, not {value}"
        ))
    })
}

/// An integer option: a `ValueError` (not `OverflowError`) when it is out of range.
fn int<'py, T: FromPyObject<'py>>(key: &str, value: &Bound<'py, PyAny>) -> PyResult<T> {
    value.extract().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(value.py()) {
            PyValueError::new_err(format!("option {key} is out of range: {value}"))
        } else {
            e
        }
    })
}

/// A number of seconds option.
fn secs(key: &str, value: &Bound<'_, PyAny>) -> PyResult<Duration> {
    seconds(key, value.extract()?)
}

/// The options of a connection or listener, and what is left over for the caller.
pub(crate) struct Parsed {
    pub(crate) options: Options,
    pub(crate) spin: Spin,
}

/// Applies one connection option; `Ok(false)` if `key` is not one.
fn apply(
    opts: &mut Options,
    tls: &mut Option<TlsOptions>,
    wait: &mut WaitPolicy,
    key: &str,
    value: &Bound<'_, PyAny>,
) -> PyResult<bool> {
    let take = std::mem::take(opts);
    *opts = match key {
        "ring_size" => take.ring_size(int(key, value)?),
        "max_msg_size" => take.max_msg_size(int(key, value)?),
        "connect_timeout" => take.connect_timeout(secs(key, value)?),
        "handshake_timeout" => take.handshake_timeout(secs(key, value)?),
        "allow_uids" => take.allow_uids(int::<Vec<u32>>(key, value)?),
        "allow_gids" => take.allow_gids(int::<Vec<u32>>(key, value)?),
        "expect_uids" => take.expect_uids(int::<Vec<u32>>(key, value)?),
        "shared_rendezvous_dir" => take.shared_rendezvous_dir(value.extract()?),
        "spin" => {
            wait.spin = secs(key, value)?;
            take
        }
        "yield_time" => {
            wait.yield_ = secs(key, value)?;
            take
        }
        "tls_cert" | "tls_key" | "tls_ca" | "tls_server_name" | "verify_hostname" => {
            let t = tls.take().unwrap_or_default();
            *tls = Some(match key {
                "tls_cert" => t.cert(Pem::file(value.extract::<std::path::PathBuf>()?)),
                "tls_key" => t.key(Pem::file(value.extract::<std::path::PathBuf>()?)),
                "tls_ca" => t.ca(Pem::file(value.extract::<std::path::PathBuf>()?)),
                "tls_server_name" => t.server_name(value.extract::<String>()?),
                _ => t.verify_hostname(value.extract()?),
            });
            take
        }
        _ => {
            *opts = take;
            return Ok(false);
        }
    };
    Ok(true)
}

/// The connection options in `kwargs` (see `docs/python.md` for the list).
pub(crate) fn connection(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Parsed> {
    let mut options = Options::default();
    let mut tls = None;
    let mut wait = options.configured_wait_policy();
    if let Some(kwargs) = kwargs {
        for (k, v) in kwargs.iter() {
            let key: String = k.extract()?;
            if !apply(&mut options, &mut tls, &mut wait, &key, &v)? {
                return Err(PyTypeError::new_err(format!("unexpected option {key:?}")));
            }
        }
    }
    finish(options, tls, wait)
}

/// The library itself never waits under Python (its objects stay non-blocking, see
/// `wait.rs`): it gets the blocking policy, and the spin budget goes to `wait.rs`. The
/// blocking policy also keeps the library from negotiating the asymmetric fence, which
/// puts a `membarrier` (microseconds) on every announcement of a wait, and `wait.rs`
/// retries by announcing.
fn finish(options: Options, tls: Option<TlsOptions>, wait: WaitPolicy) -> PyResult<Parsed> {
    let mut options = options.wait_policy(WaitPolicy::BLOCKING);
    if let Some(tls) = tls {
        options = options.tls(tls);
    }
    Ok(Parsed {
        options,
        spin: Spin {
            spin: wait.spin,
            yield_: wait.yield_,
        },
    })
}

/// The publish/subscribe options in `kwargs`: the connection options plus the topic's.
pub(crate) fn pubsub(kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<(PubSubOptions, Spin)> {
    let mut options = Options::default();
    let mut tls = None;
    let mut wait = options.configured_wait_policy();
    let mut ps = PubSubOptions::default();
    if let Some(kwargs) = kwargs {
        for (k, v) in kwargs.iter() {
            let key: String = k.extract()?;
            let v = &v;
            let taken = std::mem::take(&mut ps);
            ps = match key.as_str() {
                "slots" => taken.slots(int(&key, v)?),
                "capacity" => taken.capacity(int(&key, v)?),
                "max_msg_size" => taken.max_msg_size(int(&key, v)?),
                "policy" => taken.policy(match v.extract::<String>()?.as_str() {
                    "block" => Policy::Block,
                    "overwrite" => Policy::Overwrite,
                    other => {
                        return Err(PyValueError::new_err(format!(
                            "policy must be 'block' or 'overwrite', not {other:?}"
                        )))
                    }
                }),
                "stall_timeout" => taken.stall_timeout(secs(&key, v)?),
                "history" => taken.history(int(&key, v)?),
                "max_subscribers" => taken.max_subscribers(int(&key, v)?),
                _ => {
                    if !apply(&mut options, &mut tls, &mut wait, &key, v)? {
                        return Err(PyTypeError::new_err(format!("unexpected option {key:?}")));
                    }
                    taken
                }
            };
        }
    }
    let parsed = finish(options, tls, wait)?;
    Ok((
        ps.options(parsed.options).wait_policy(WaitPolicy::BLOCKING),
        parsed.spin,
    ))
}
