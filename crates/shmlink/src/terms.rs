//! The library's messages in a front end's terms.
//!
//! Errors that tell the reader what to change name the option as the Rust API spells it
//! (`Options::shared_rendezvous_dir(true)`, `Options::allow_uids`) or speak of handshake
//! packet kinds. A front end whose users know other names (the `shmlink` command's flags,
//! the Python package's keywords, the C API's setters) gives its [`Vocabulary`] to
//! [`rephrase`] before it shows a message.

/// How a front end names what the library's messages name as Rust items.
#[derive(Clone, Copy, Debug)]
pub struct Vocabulary<'a> {
    /// For `Options::shared_rendezvous_dir(true)` (e.g. `--shared-dir`).
    pub shared_rendezvous_dir: &'a str,
    /// For `Options::allow_uids`: `{uid}` in it becomes the uid the message names, or
    /// `UID` where it names none (e.g. `--allow-uid {uid}`).
    pub allow_uids: &'a str,
    /// For `Options::expect_uids` (e.g. `--expect-uid UID`).
    pub expect_uids: &'a str,
    /// For `PubSubOptions::allow_writable_topic(true)`.
    pub allow_writable_topic: &'a str,
    /// For "connect with Subscriber::connect", said to a plain client at a topic.
    pub subscribe: &'a str,
    /// For "packet kind N is publish/subscribe, and this is a plain shm: peer", said to a
    /// subscriber at a plain listener: what the listener is and how to reach it.
    pub plain_listener: &'a str,
}

/// `msg` with the Rust names [`Vocabulary`] lists replaced by the front end's; other
/// messages come back as they are.
pub fn rephrase(msg: &str, v: &Vocabulary<'_>) -> String {
    let mut text = msg.to_string();
    // "Options::allow_uids (`--allow-uid N` on shmlink's command line)": the uid is in
    // the command-line flag that follows the Rust name.
    const ALLOW: &str = "Options::allow_uids (`--allow-uid ";
    while let Some(start) = text.find(ALLOW) {
        let uid_start = start + ALLOW.len();
        let uid: String = text[uid_start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        let end = text[uid_start..]
            .find(')')
            .map_or(text.len(), |i| uid_start + i + 1);
        text.replace_range(start..end, &v.allow_uids.replace("{uid}", &uid));
    }
    const PLAIN: &str = " is publish/subscribe, and this is a plain shm: peer";
    if let (Some(kind), Some(end)) = (text.find("packet kind "), text.find(PLAIN)) {
        if kind < end {
            let mut stop = end + PLAIN.len();
            // The subscriber's own guess, answered by the new text.
            if let Some(rest) = text[stop..].strip_prefix(" (is ") {
                if let Some(close) = rest.find(" a publisher?)") {
                    stop += " (is ".len() + close + " a publisher?)".len();
                }
            }
            text.replace_range(kind..stop, v.plain_listener);
        }
    }
    let allow_any = v.allow_uids.replace("{uid}", "UID");
    for (rust, theirs) in [
        (
            "Options::shared_rendezvous_dir(true)",
            v.shared_rendezvous_dir,
        ),
        ("shared_rendezvous_dir(true)", v.shared_rendezvous_dir),
        ("Options::expect_uids", v.expect_uids),
        ("Options::allow_uids", &allow_any),
        (
            "PubSubOptions::allow_writable_topic(true)",
            v.allow_writable_topic,
        ),
        ("connect with Subscriber::connect", v.subscribe),
    ] {
        text = text.replace(rust, theirs);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::{rephrase, Vocabulary};

    const V: Vocabulary<'static> = Vocabulary {
        shared_rendezvous_dir: "SHARED",
        allow_uids: "ALLOW({uid})",
        expect_uids: "EXPECT",
        allow_writable_topic: "WRITABLE",
        subscribe: "SUBSCRIBE",
        plain_listener: "PLAIN",
    };

    #[test]
    fn rust_names_become_the_front_ends() {
        assert_eq!(
            rephrase("declare it with Options::shared_rendezvous_dir(true)", &V),
            "declare it with SHARED"
        );
        assert_eq!(
            rephrase("declare it with shared_rendezvous_dir(true) if", &V),
            "declare it with SHARED if"
        );
        assert_eq!(
            rephrase(
                "admits it with Options::allow_uids (`--allow-uid 7` on shmlink's command line)",
                &V
            ),
            "admits it with ALLOW(7)"
        );
        assert_eq!(
            rephrase("with Options::allow_uids, or", &V),
            "with ALLOW(UID), or"
        );
        assert_eq!(
            rephrase("list it with Options::expect_uids", &V),
            "list it with EXPECT"
        );
        assert_eq!(
            rephrase("set PubSubOptions::allow_writable_topic(true)", &V),
            "set WRITABLE"
        );
        assert_eq!(
            rephrase("shm:t is a topic: connect with Subscriber::connect", &V),
            "shm:t is a topic: SUBSCRIBE"
        );
        assert_eq!(
            rephrase(
                "refused: packet kind 17 is publish/subscribe, and this is a plain shm: peer \
                 (is shm:x a publisher?), bye",
                &V
            ),
            "refused: PLAIN, bye"
        );
        assert_eq!(rephrase("nothing to change", &V), "nothing to change");
    }
}
