//! Token sources: the per-session `tokenizer` setting (exact o200k / cl100k counts) and
//! model-reported output tokens, which take precedence over any estimate.

use futures::executor::block_on;
use serde_json::json;
use sessiondb::{
    AppendOptions, Db, Encoding, Error, Message, SessionPatch, SessionRecord, TiktokenCounter,
    TokenCounter,
};

fn settings(value: serde_json::Value) -> SessionPatch {
    SessionPatch {
        settings: Some(value.as_object().unwrap().clone()),
        ..Default::default()
    }
}

#[test]
fn a_session_counts_with_the_tokenizer_it_chooses() {
    block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        // Code-like text: the heuristic and the BPE disagree clearly.
        let text = "fn main() { println!(\"{:?}\", vec![1, 2, 3].iter().map(|x| x * 2).collect::<Vec<_>>()); }";
        let message = || Message::text("user", text);

        let plain = db.session("plain").unwrap();
        let heuristic = plain
            .append(message(), AppendOptions::default())
            .await
            .unwrap();

        let exact = db.session("exact").unwrap();
        exact
            .append(message(), AppendOptions::default())
            .await
            .unwrap();
        exact
            .patch(settings(json!({"tokenizer": "o200k"})))
            .await
            .unwrap();
        let counted = exact
            .append(message(), AppendOptions::default())
            .await
            .unwrap();

        let expected = TiktokenCounter {
            encoding: Encoding::O200k,
        }
        .count_message(message().as_map());
        assert_eq!(counted.message.token_estimate, expected);
        assert_ne!(
            counted.message.token_estimate,
            heuristic.message.token_estimate
        );
        let stats = exact.stats().await.unwrap();
        assert_eq!(
            stats.token_estimate,
            heuristic.message.token_estimate + expected
        );

        // Chosen at creation, and cl100k is a different vocabulary.
        let created = db
            .create_session(
                "",
                Some("gpt4".into()),
                SessionRecord {
                    settings: json!({"tokenizer": "cl100k"}).as_object().unwrap().clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(created.record.settings["tokenizer"], "cl100k");
        let gpt4 = db.session("gpt4").unwrap();
        let counted = gpt4
            .append(message(), AppendOptions::default())
            .await
            .unwrap();
        assert_eq!(
            counted.message.token_estimate,
            TiktokenCounter {
                encoding: Encoding::Cl100k
            }
            .count_message(message().as_map())
        );

        // Back to the heuristic by deleting the setting.
        exact
            .patch(settings(json!({"tokenizer": null})))
            .await
            .unwrap();
        let again = exact
            .append(message(), AppendOptions::default())
            .await
            .unwrap();
        assert_eq!(
            again.message.token_estimate,
            heuristic.message.token_estimate
        );

        let refused = exact.patch(settings(json!({"tokenizer": "gpt2"}))).await;
        assert!(matches!(refused, Err(Error::Invalid(e)) if e.field == "settings.tokenizer"));
    });
}

#[test]
fn model_reported_output_tokens_take_precedence() {
    block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(dir.path()).unwrap();
        let s = db.session("s").unwrap();
        let usage = json!({"usage": {"inputTokens": 5000, "outputTokens": 777}});
        let reported = Message::text("assistant", "short answer")
            .with_metadata(usage.as_object().unwrap().clone());
        let stored = s.append(reported, AppendOptions::default()).await.unwrap();
        assert_eq!(stored.message.token_estimate, 777);
        s.patch(settings(json!({"tokenizer": "o200k"})))
            .await
            .unwrap();
        let reported = Message::text("assistant", "another").with_metadata(
            json!({"usage": {"completion_tokens": 9}})
                .as_object()
                .unwrap()
                .clone(),
        );
        let stored = s.append(reported, AppendOptions::default()).await.unwrap();
        assert_eq!(
            stored.message.token_estimate, 9,
            "over the session's tokenizer too"
        );
        assert_eq!(s.stats().await.unwrap().token_estimate, 786);
    });
}
