//! `pipe`: two anonymous pipes, one per direction, inherited by the peer.

use std::io;
use std::os::fd::AsRawFd;

use super::fdio::StreamEnd;
use crate::method::{arg, Ctx, Endpoint, Method, Prepared};
use crate::sys::{inherited_fd, pipe};

pub struct Pipe;

impl Method for Pipe {
    fn name(&self) -> &'static str {
        "pipe"
    }

    fn about(&self) -> &'static str {
        "two anonymous pipes (pipe2), default capacity, read/write"
    }

    fn prepare(&self, _ctx: &Ctx) -> io::Result<Prepared> {
        let (a2b_r, a2b_w) = pipe()?;
        let (b2a_r, b2a_w) = pipe()?;
        let args = vec![a2b_r.as_raw_fd().to_string(), b2a_w.as_raw_fd().to_string()];
        Ok(Prepared::ready(
            args,
            vec![a2b_r, b2a_w],
            StreamEnd::new(b2a_r, a2b_w),
        ))
    }

    fn connect(&self, _ctx: &Ctx, args: &[String]) -> io::Result<Box<dyn Endpoint>> {
        let rx = inherited_fd(arg(args, 0, "read fd")?)?;
        let tx = inherited_fd(arg(args, 1, "write fd")?)?;
        Ok(Box::new(StreamEnd::new(rx, tx)))
    }
}
