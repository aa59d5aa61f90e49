//! Chat-template behaviour beyond the reference prompts: tools, Python compatibility, errors
//! that name template and line, and the limits that stop hostile templates.
//!
//! Expected strings are derived by hand from the template logic and Python's semantics; they
//! were cross-checked once with jinja2 configured as HF's `apply_chat_template` configures it.

use std::time::{Duration, Instant, UNIX_EPOCH};

use minfer::chat::{
    ChatMessage, ChatTemplate, Limit, Limits, RenderOptions, TemplateError,
    parse_chat_request_json, parse_messages_json,
};

const QWEN: &str = include_str!("data/qwen2.5-chat-template.jinja");

fn render(source: &str, messages: &[ChatMessage]) -> Result<String, TemplateError> {
    ChatTemplate::new("t", source)?.render(messages, &RenderOptions::default())
}

fn render_ok(source: &str) -> String {
    render(source, &[]).unwrap_or_else(|e| panic!("{e}"))
}

// ---------------------------------------------------------------------------------------------
// Tools

/// A tool-calling conversation as an OpenAI-style request body. Key order in the tool schema
/// (`type` before `function`) is not alphabetical, so a renderer that sorts keys fails.
const TOOL_REQUEST: &str = r#"{
  "model": "ignored",
  "tools": [{"type": "function", "function": {
      "name": "get_weather",
      "description": "Get the weather in a city, e.g. \"Paris\" — in °C.",
      "parameters": {"type": "object",
                     "properties": {"city": {"type": "string"},
                                    "days": {"type": "integer", "minimum": 1}},
                     "required": ["city"]}}}],
  "messages": [
    {"role": "user", "content": "What's the weather in Zürich?"},
    {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
        {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2, "threshold": 0.5}}}]},
    {"role": "tool", "name": "get_weather", "content": "{\"temp_c\": 21.5}"},
    {"role": "tool", "name": "get_weather", "content": "sunny"}
  ]
}"#;

#[test]
fn qwen_tools_render_as_python_json_dumps_prints_them() {
    let request = parse_chat_request_json(TOOL_REQUEST).unwrap();
    let template = ChatTemplate::new("qwen2.5", QWEN).unwrap();
    let opts = RenderOptions {
        add_generation_prompt: true,
        tools: request.tools.clone(),
        ..RenderOptions::default()
    };
    let rendered = template.render(&request.messages, &opts).unwrap();

    // The template's tools branch: default system text, then each tool as
    // `json.dumps(tool, ensure_ascii=False)` (", " and ": " separators, insertion order,
    // non-ASCII kept, `"` escaped), then the tool-call instructions.
    let tool_json = concat!(
        r#"{"type": "function", "function": {"name": "get_weather", "#,
        r#""description": "Get the weather in a city, e.g. \"Paris\" — in °C.", "#,
        r#""parameters": {"type": "object", "properties": {"city": {"type": "string"}, "#,
        r#""days": {"type": "integer", "minimum": 1}}, "required": ["city"]}}}"#
    );
    let expected = [
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
        "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n",
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
        "\n",
        tool_json,
        "\n</tools>\n\nFor each function call, return a json object with function name and ",
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n",
        "{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n",
        // The user turn.
        "<|im_start|>user\nWhat's the weather in Zürich?<|im_end|>\n",
        // Assistant with tool calls: content null is falsy, so no "\n" + content; the
        // arguments go through `tojson` (0.5 prints as Python's repr).
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": ",
        "{\"city\": \"Zürich\", \"days\": 2, \"threshold\": 0.5}}\n</tool_call><|im_end|>\n",
        // Consecutive tool messages share one user turn.
        "<|im_start|>user\n<tool_response>\n{\"temp_c\": 21.5}\n</tool_response>",
        "\n<tool_response>\nsunny\n</tool_response><|im_end|>\n",
        "<|im_start|>assistant\n",
    ]
    .concat();
    assert_eq!(rendered, expected);
}

#[test]
fn no_tools_is_none_as_with_hf() {
    assert_eq!(
        render_ok("{{ tools is none }} {{ tools is defined }}"),
        "True True"
    );
}

// ---------------------------------------------------------------------------------------------
// Python / HF compatibility

#[test]
fn whitespace_control_is_hfs_trim_and_lstrip_blocks() {
    let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\n    <{{ m.content }}>\n  \
                  {% endif %}\n{% endfor %}\n";
    let messages = [
        ChatMessage::user("a"),
        ChatMessage::new("bot", "b"),
        ChatMessage::user("c"),
    ];
    assert_eq!(render(source, &messages).unwrap(), "    <a>\n    <c>\n");
}

#[test]
fn one_trailing_newline_is_dropped_as_in_jinja2() {
    assert_eq!(render_ok("x\n"), "x");
    assert_eq!(render_ok("x\n\n"), "x\n");
}

#[test]
fn values_print_as_python_str() {
    assert_eq!(
        render_ok(
            "{{ none }} {{ true }} {{ [1, 'a', none, 2.50] }} {{ {'k': 1e20, \"it's\": false} }} \
             [{{ undefined_thing }}]"
        ),
        "None True [1, 'a', None, 2.5] {'k': 1e+20, \"it's\": False} []"
    );
}

#[test]
fn tojson_takes_json_dumps_arguments() {
    let source = "{% set x = {'b': [1, 2.0, none, {'é': 'ü\\n'}], 'a': true, 'n': []} %}\
                  {{ x|tojson }}\n{{ x|tojson(indent=2) }}\n{{ x|tojson(separators=(',', ':')) }}\n\
                  {{ x|tojson(sort_keys=true) }}\n{{ x|tojson(ensure_ascii=true) }}\n\
                  {{ {}|tojson(indent=2) }}|{{ []|tojson }}|{{ 'é'|tojson }}";
    let expected = [
        r#"{"b": [1, 2.0, null, {"é": "ü\n"}], "a": true, "n": []}"#,
        "{\n  \"b\": [\n    1,\n    2.0,\n    null,\n    {\n      \"é\": \"ü\\n\"\n    }\n  ],\n  \
         \"a\": true,\n  \"n\": []\n}",
        r#"{"b":[1,2.0,null,{"é":"ü\n"}],"a":true,"n":[]}"#,
        r#"{"a": true, "b": [1, 2.0, null, {"é": "ü\n"}], "n": []}"#,
        r#"{"b": [1, 2.0, null, {"\u00e9": "\u00fc\n"}], "a": true, "n": []}"#,
        r#"{}|[]|"é""#,
    ]
    .join("\n");
    assert_eq!(render_ok(source), expected);
}

#[test]
fn python_string_and_dict_methods_work() {
    let source = "{% set d = {'x': 1, 'y': 'two'} %}{{ '  a b  '.strip() }}|{{ 'a,b'.split(',') }}|\
                  {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.get('z', 'dflt') }}|\
                  {{ 'Hi'.startswith('H') }}";
    assert_eq!(render_ok(source), "a b|['a', 'b']|x=1;y=two;|dflt|True");
}

#[test]
fn strftime_now_uses_the_render_clock() {
    let template = ChatTemplate::new("t", "Today Date: {{ strftime_now('%d %b %Y') }}").unwrap();
    let opts = RenderOptions {
        now: Some(UNIX_EPOCH + Duration::from_secs(1_722_001_509)),
        ..RenderOptions::default()
    };
    assert_eq!(
        template.render(&[], &opts).unwrap(),
        "Today Date: 26 Jul 2024"
    );
}

#[test]
fn no_html_escaping_whatever_the_name() {
    let template = ChatTemplate::new("chat.html", "{{ messages[0].content }}").unwrap();
    let out = template
        .render(&[ChatMessage::user("<a & 'b'>")], &RenderOptions::default())
        .unwrap();
    assert_eq!(out, "<a & 'b'>");
}

#[test]
fn bos_eos_and_extra_variables_reach_the_template() {
    let template = ChatTemplate::new(
        "t",
        "{{ bos_token }}{% if enable_thinking is false %}/no_think{% endif %}{{ eos_token }}",
    )
    .unwrap();
    let mut opts = RenderOptions {
        bos_token: "<s>".into(),
        eos_token: "</s>".into(),
        ..RenderOptions::default()
    };
    opts.extra
        .insert("enable_thinking".into(), serde_json::Value::Bool(false));
    assert_eq!(template.render(&[], &opts).unwrap(), "<s>/no_think</s>");

    opts.extra
        .insert("messages".into(), serde_json::Value::Array(vec![]));
    assert!(matches!(
        template.render(&[], &opts),
        Err(TemplateError::BadInput { .. })
    ));
}

#[test]
fn absent_fields_are_undefined_and_null_ones_none() {
    let messages =
        parse_messages_json(r#"[{"role": "a"}, {"role": "b", "content": null}]"#).unwrap();
    let out = render(
        "{% for m in messages %}{{ m.content is defined }}/{{ m.content is none }};{% endfor %}",
        &messages,
    )
    .unwrap();
    assert_eq!(out, "False/False;True/True;");
}

// ---------------------------------------------------------------------------------------------
// Errors name the template and the line

#[test]
fn syntax_error_names_template_and_line() {
    let source = "{% for m in messages %}\n{{ m.content }}\n{% endif %}\n";
    let err = ChatTemplate::new("broken", source).unwrap_err();
    match &err {
        TemplateError::Syntax { template, line, .. } => {
            assert_eq!(template, "broken");
            assert_eq!(*line, Some(3));
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.contains("`broken`") && text.contains("line 3"),
        "{text}"
    );
}

#[test]
fn undefined_method_names_template_and_line() {
    let template = ChatTemplate::new(
        "methods",
        "a\n{{ 'x' }}\n{{ messages[0].content.frobnicate() }}\n",
    )
    .unwrap();
    let err = template
        .render(&[ChatMessage::user("hi")], &RenderOptions::default())
        .unwrap_err();
    match &err {
        TemplateError::Render {
            template,
            line,
            message,
        } => {
            assert_eq!(template, "methods");
            assert_eq!(*line, Some(3));
            assert!(
                message.contains("frobnicate") || message.contains("method"),
                "{message}"
            );
        }
        other => panic!("expected a render error, got {other:?}"),
    }
    assert!(err.to_string().contains("line 3"), "{err}");
}

#[test]
fn raise_exception_names_template_line_and_message() {
    let source = "{% if messages[0].role != 'system' %}\n\
                  {{ raise_exception('Conversation must start with a system message') }}\n\
                  {% endif %}";
    let err = render(source, &[ChatMessage::user("hi")]).unwrap_err();
    assert_eq!(
        err,
        TemplateError::Raised {
            template: "t".into(),
            line: Some(2),
            message: "Conversation must start with a system message".into(),
        }
    );
    assert_eq!(
        err.to_string(),
        "chat template `t` line 2: raise_exception: Conversation must start with a system message"
    );
}

#[test]
fn tojson_of_undefined_is_an_error_as_in_python() {
    let err = render("\n{{ nothing | tojson }}", &[]).unwrap_err();
    assert!(
        matches!(err, TemplateError::Render { line: Some(2), .. }),
        "{err:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Limits: a hostile template returns an error, quickly, instead of hanging or crashing

fn assert_limit(result: Result<String, TemplateError>, want: Limit) {
    match result {
        Err(TemplateError::LimitExceeded {
            limit, template, ..
        }) => {
            assert_eq!(limit, want);
            assert_eq!(template, "t");
        }
        other => panic!("expected a {want} limit error, got {other:?}"),
    }
}

#[test]
fn endless_loop_runs_out_of_fuel() {
    let start = Instant::now();
    let source = "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}\
                  {% endfor %}";
    assert_limit(render(source, &[]), Limit::Fuel);
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "took {:?}",
        start.elapsed()
    );
}

#[test]
fn output_growth_runs_out_of_fuel() {
    let source = "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}\
                  {% endfor %}{{ ns.s | length }}";
    assert_limit(render(source, &[]), Limit::Fuel);
}

#[test]
fn small_fuel_budget_is_honoured() {
    let template = ChatTemplate::with_limits(
        "t",
        "{% for i in range(1000) %}{{ i }}{% endfor %}",
        Limits {
            fuel: 500,
            ..Limits::default()
        },
    )
    .unwrap();
    assert_limit(template.render(&[], &RenderOptions::default()), Limit::Fuel);
}

#[test]
fn endless_macro_recursion_hits_the_recursion_limit() {
    let source = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    assert_limit(render(source, &[]), Limit::Recursion);
}

#[test]
fn recursive_loop_over_deep_data_hits_a_limit() {
    let source = "{% set ns = namespace(x=[]) %}{% for i in range(600) %}{% set ns.x = [ns.x] %}\
                  {% endfor %}{% for item in [ns.x] recursive %}[{{ loop(item) }}]{% endfor %}";
    assert_limit(render(source, &[]), Limit::Recursion);
}

#[test]
fn deeply_nested_data_is_refused_not_overflowed() {
    let build = "{% set ns = namespace(x=[]) %}{% for i in range(5000) %}{% set ns.x = [ns.x] %}\
                 {% endfor %}";
    assert_limit(
        render(&format!("{build}{{{{ ns.x | tojson }}}}"), &[]),
        Limit::Recursion,
    );
    assert_limit(
        render(&format!("{build}{{{{ ns.x }}}}"), &[]),
        Limit::Recursion,
    );
}

#[test]
fn data_nested_as_deep_as_the_fuel_allows_does_not_overflow_the_stack() {
    // About 400 000 levels before the fuel runs out; dropping, printing or comparing them
    // recurses inside the engine, which is why renders run on a large-stack thread.
    let build = "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% for j in range(1000) %}\
                 {% set ns.x = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[ns.x]]]]]]]]]]]]]]]]]]]]\
                 ]]]]]]]]]]]]]]]]]]]]]]]]]]]]]] %}{% endfor %}{% endfor %}";
    assert_limit(render(build, &[]), Limit::Fuel);
    // 250 000 levels, then operations that walk them.
    let build = build.replace(
        "range(1000) %}{% for j in range(1000)",
        "range(5000) %}{% for j in range(1)",
    );
    for op in [
        "{{ ns.x == [ns.x] }}",
        "{{ {ns.x: 1} | length }}",
        "{{ ns.x in [1, [ns.x]] }}",
    ] {
        let out = render(&format!("{build}{op}"), &[]);
        assert!(
            out.is_ok() || matches!(out, Err(TemplateError::LimitExceeded { .. })),
            "{op}: {out:?}"
        );
    }
    for op in ["{{ ns.x | pprint }}", "{{ ns.x | tojson }}", "{{ ns.x }}"] {
        assert_limit(render(&format!("{build}{op}"), &[]), Limit::Recursion);
    }
}

#[test]
fn huge_format_widths_are_paid_for_before_allocating() {
    // Without the up-front charge this asks for a 10 GB string and aborts the process.
    assert_limit(
        render("{{ '{:>10000000000}'.format('x') }}", &[]),
        Limit::Fuel,
    );
    assert_eq!(
        render_ok("{{ '{:>5}|{:.2f}'.format('x', 1.5) }}"),
        "    x|1.50"
    );
}

#[test]
fn pprint_prints_python_repr() {
    assert_eq!(
        render_ok("{{ {'a': [1, 'b', none]} | pprint }}"),
        "{'a': [1, 'b', None]}"
    );
}

// ---------------------------------------------------------------------------------------------
// Reading messages from JSON

#[test]
fn messages_json_accepts_an_array_or_an_object() {
    let m = parse_messages_json(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    assert_eq!(m, vec![ChatMessage::user("hi")]);

    let r = parse_chat_request_json(
        r#"{"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}"#,
    )
    .unwrap();
    assert_eq!(r.messages, vec![ChatMessage::user("hi")]);
    assert_eq!(r.tools, Some(serde_json::json!([{"type": "function"}])));

    let r = parse_chat_request_json(r#"{"messages": [], "tools": null}"#).unwrap();
    assert_eq!(r.tools, None);
}

#[test]
fn messages_json_with_a_bad_shape_says_what_is_wrong() {
    let cases = [
        ("not json", "not valid JSON"),
        ("42", "expected an array of messages"),
        (r#"{"msgs": []}"#, "\"messages\""),
        (r#"{"messages": {}}"#, "\"messages\" must be an array"),
        (
            r#"[{"role": "user"}, "hi"]"#,
            "messages[1]: expected an object",
        ),
        (r#"[{"content": "hi"}]"#, "messages[0]: missing \"role\""),
        (r#"[{"role": 1}]"#, "messages[0]: \"role\" must be a string"),
        (
            r#"{"messages": [], "tools": {}}"#,
            "\"tools\" must be an array",
        ),
        (
            r#"{"messages": [], "tools": [1]}"#,
            "tools[0]: expected an object",
        ),
    ];
    for (text, want) in cases {
        match parse_messages_json(text) {
            Err(TemplateError::BadInput { message }) => {
                assert!(message.contains(want), "{text}: {message}")
            }
            other => panic!("{text}: expected BadInput, got {other:?}"),
        }
    }
}
