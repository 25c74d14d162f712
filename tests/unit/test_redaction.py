"""What a stored text may keep of an endpoint URL (worker/rules/redaction.py): no I/O, no receiver."""

import base64
import json
import string
from urllib.parse import quote

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from worker.rules.redaction import MIN_SECRET_CHARS, REDACTED, redact, secret_forms

SLACK = "https://hooks.slack.com/services/T0FAKETEAM/B0FAKEBOT/SECRETPATHTOKEN24CHARSxx?token=SECRETQUERY1"
SECRETS = ("SECRETPATHTOKEN24CHARSxx", "SECRETQUERY1", "T0FAKETEAM", "B0FAKEBOT")


def leaks(text: str, secrets=SECRETS) -> list[str]:
    folded = text.lower()
    return [s for s in secrets if s.lower() in folded]


def test_an_express_404_keeps_its_words_and_loses_the_path_and_query():
    page = ('<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>Error</title>\n'
            "</head>\n<body>\n<pre>Cannot POST /services/T0FAKETEAM/B0FAKEBOT/SECRETPATHTOKEN24CHARSxx"
            "?token=SECRETQUERY1</pre>\n</body>\n</html>\n")
    redacted = redact(page, SLACK)
    assert leaks(redacted) == []
    assert f"<pre>Cannot POST {REDACTED}</pre>" in redacted
    assert redacted.startswith('<!DOCTYPE html>\n<html lang="en">') and "<title>Error</title>" in redacted


def test_a_redirect_page_quoting_the_whole_url_keeps_the_host():
    page = f"Found. Redirecting to {SLACK.replace('https://', 'http://')}/"
    assert redact(page, SLACK) == f"Found. Redirecting to http://hooks.slack.com{REDACTED}/"


# A path and query that are stored, sent and decoded in different spellings: yarl (what aiohttp
# sends) encodes the space and the é, keeps %2F, decodes %41 to A and, in the query, %21 and %2F.
ODD = "https://hooks.example.com/in/%41ccount%2FSECRET%20PART/é-TOKENVALUE?key=SECRET+VALUE%21&next=%2Fhome"


@pytest.mark.parametrize(("form", "echo"), [
    ("as stored", "/in/%41ccount%2FSECRET%20PART/é-TOKENVALUE?key=SECRET+VALUE%21&next=%2Fhome"),
    ("as sent", "/in/Account%2FSECRET%20PART/%C3%A9-TOKENVALUE?key=SECRET+VALUE!&next=/home"),
    ("hex in lower case", "/in/accOUNT%2fsecret%20part/%c3%a9-tokenvalue?key=secret+value%21&next=%2fhome"),
    ("decoded", "/in/Account/SECRET PART/é-TOKENVALUE?key=SECRET+VALUE!&next=/home"),
    ("form-decoded query", "key=SECRET VALUE!"),
    ("encoded whole", quote("/in/Account/SECRET PART/é-TOKENVALUE", safe="")),
    ("HTML-escaped", "/in/Account/SECRET PART/é-TOKENVALUE?key=SECRET+VALUE!&amp;next=/home"),
])
def test_every_spelling_of_the_path_and_query_is_redacted(form, echo):
    redacted = redact(f"Cannot POST {echo} (sorry)", ODD)
    assert leaks(redacted, ("SECRET", "TOKENVALUE")) == [], form
    assert redacted.startswith("Cannot POST ") and redacted.endswith(" (sorry)"), form


def test_path_segments_and_query_values_are_redacted_wherever_they_appear_alone():
    # a receiver that answers JSON: slashes escaped, the query parsed into fields
    answer = json.dumps({"error": "invalid_token", "path": "\\/services\\/T0FAKETEAM\\/B0FAKEBOT\\/"
                         "SECRETPATHTOKEN24CHARSxx", "query": {"token": "SECRETQUERY1"}})
    redacted = redact(answer, SLACK)
    assert leaks(redacted) == []
    assert json.loads(redacted)["error"] == "invalid_token"
    assert json.loads(redacted)["query"] == {"token": REDACTED}


def test_userinfo_is_redacted_whole_and_in_parts_and_as_the_basic_credentials_it_is_sent_as():
    url = "https://hook-user:S3CRET%40PW99@receiver.example.com/in"
    basic = base64.b64encode(b"hook-user:S3CRET@PW99").decode()
    text = (f"user hook-user:S3CRET%40PW99, password S3CRET@PW99 or S3CRET%40PW99, "
            f"Authorization: Basic {basic}")
    redacted = redact(text, url)
    assert leaks(redacted, ("S3CRET", basic)) == []
    assert redacted.startswith("user ") and ", password " in redacted and "Authorization: Basic " in redacted


def test_a_path_of_a_slash_or_of_short_words_leaves_the_text_alone():
    text = "POST / failed: see /api/v1/docs, the hooks and page=2"
    assert redact(text, "https://receiver.example.com/") == text
    assert redact(text, "https://receiver.example.com") == text
    # "api", "v1", "hooks", "page=2" are each shorter than MIN_SECRET_CHARS; only the whole path
    # and query, which the text does not hold, would be redacted
    assert redact(text, "https://receiver.example.com/api/v1/hooks?page=2") == text
    assert secret_forms("https://receiver.example.com/api/v1") == []
    assert all(len(form) >= MIN_SECRET_CHARS for form in secret_forms(SLACK))


def test_a_short_piece_is_redacted_inside_the_part_it_belongs_to():
    url = "https://receiver.example.com/hooks/team-a?k=v"
    assert redact("Cannot POST /hooks/team-a?k=v", url) == f"Cannot POST {REDACTED}"
    assert redact("Cannot POST /hooks/team-a", url) == f"Cannot POST {REDACTED}"
    assert redact("team-a is not a team", url) == "team-a is not a team"


def test_a_text_cut_inside_a_secret_loses_the_start_of_it_too():
    text = "Cannot POST /services/T0FAKETEAM/B0FAKEBOT/SECRETPATH"  # the rest was cut off
    assert redact(text, SLACK, cut=True) == f"Cannot POST {REDACTED}"
    # a whole text (not cut) ending in a prefix of the path is what the receiver wrote
    assert "SECRETPATH" in redact(text.replace("T0FAKETEAM/B0FAKEBOT/", ""), SLACK)


def test_a_url_that_does_not_parse_is_still_redacted():
    url = "http://user:SECRETPASS@[::1/SECRETPATH?token=SECRETQUERY"
    redacted = redact("bad URL http://user:SECRETPASS@[::1/SECRETPATH?token=SECRETQUERY", url)
    assert leaks(redacted, ("SECRETPASS", "SECRETPATH", "SECRETQUERY")) == []


def test_short_texts_and_no_url_change_nothing():
    assert redact("ok", SLACK) == "ok"
    assert redact("SECRETQUERY1", "") == "SECRETQUERY1"
    assert redact("", SLACK) == ""


URL_CHARS = st.sampled_from([*"abcXYZ019-._~%2Fé+&=;?/:@# ", "%41", "%2B", "%C3%A9", "%7e"])


@settings(max_examples=300, deadline=None)
@example(tail="aaa%%41aaa", junk=[], picks=[106])  # escapes split runs: `41aaa` is in no decoded form
@example(tail="in/x%2By%C3%A9z-TOKEN?a=b+c%21", junk=["<p>"], picks=[0, 3, 5, 7])
@given(tail=st.lists(URL_CHARS, min_size=1, max_size=40).map("".join),
       junk=st.lists(st.text(max_size=6) | URL_CHARS, max_size=6),
       picks=st.lists(st.integers(0, 200), max_size=4))
def test_looking_only_for_the_forms_a_text_may_hold_finds_every_form_it_holds(tail, junk, picks):
    # secret_forms(url, within) skips a piece whose longest run of unreserved characters the text
    # lacks: it must find exactly the forms that a search for all of them finds
    url = f"https://user:pw{tail[:5]}@h.example/{tail}"
    every = secret_forms(url)
    text = "".join(junk) + "".join(every[p % len(every)] for p in picks if every) + "".join(junk[:2])
    folded = text.translate(str.maketrans(string.ascii_uppercase, string.ascii_lowercase))
    assert secret_forms(url, folded) == [f for f in every if f in folded]
