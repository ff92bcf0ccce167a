//! What the bridge tests share: the test messages ([`msg`]), the peer processes
//! ([`roles`]) and the network-namespace hosts ([`hosts`]).
#![allow(dead_code)]

pub mod hosts;
pub mod msg;
pub mod roles;
