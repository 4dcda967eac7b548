"""The accuracy reward, class by class: hand-written completions, each with the verdict the
mathematics gives (paid or not), through the public API (``answer_matches``, ``accuracy_reward``)
and each task's reward path.

A class is a way an answer can be written that a grader reading numbers out of the text, instead of
comparing the answer whole, gets wrong: words or units in the answer, hedges, commas and spaces,
several boxes for a list, chained results, display maths after "Answer", a restated question, and
on reasoning-gym tasks a wrong number that the data set's own verifier credits in part, or a right
answer that spans several lines. The verdicts are worked out by hand from the values, never from a
grader's output.
"""

import importlib.util
from functools import lru_cache

import pytest

from conftest import graded_cases
from podsrl.rewards import accuracy_reward, answer_matches
from podsrl.tasks import arithmetic


pytestmark = pytest.mark.usefixtures("unhurried_pool")  # grades, not the pool's bound (conftest)


# (completion, gold, should_pay), by class; each verdict from the values written.
CLASSES: dict[str, list[tuple[str, str, bool]]] = {
    # A word or unit in the answer: the answer is compared whole, the unit stripped only where what
    # remains is one complete expression (then that whole expression is compared).
    "words_in_answer": [
        (r"\boxed{\sqrt{4} \text{ units}}", "4", False),  # sqrt(4) = 2
        (r"\boxed{\sqrt{4} \text{ units}}", "2", True),
        (r"\boxed{\frac{1}{10} \text{ units}}", "10", False),  # 1/10
        (r"\boxed{\frac{1}{10} \text{ units}}", "0.1", True),
        ("The answer is 10^2 apples.", "2", False),  # 100
        ("The answer is 10^2 apples.", "100", True),
        (r"\boxed{2^{10} \text{ units}}", "10", False),  # 1024
        (r"\boxed{2^{10} \text{ units}}", "1024", True),
        (r"\boxed{3\sqrt{2} \text{ cm}}", "2", False),  # 4.24...
        (r"\boxed{\text{not } 12}", "12", False),
        (r"\boxed{AB12}", "12", False),
        ("The final answer is AZYUK2A.", "2", False),
        (r"\boxed{12 \text{ cm}}", "12", True),
        ("The answer is 45 apples.", "45", True),
        (r"The final answer is $15 \text{ dollars}$.", "15", True),
    ],
    # A hedge names two answers; one of them being right is not an answer.
    "hedges": [
        (r"The final answer is $2 \text{ or } 3$.", "3", False),
        (r"The final answer is $2 \text{ or } 3$.", "2", False),
        (r"\boxed{2 \text{ or } 3}", "3", False),
        ("The answer is 2 or 3.", "3", False),
        ("<answer>2 or 3</answer>", "3", False),
        ("#### 5 or 6", "6", False),
        (r"\boxed{\text{either } 7 \text{ or } 8}", "8", False),
    ],
    # Commas and spaces are part of the answer: a thousands separator only in the 1,234,567 pattern.
    "commas_and_spaces": [
        (r"\boxed{1, 2}", "12", False),
        (r"\boxed{12}", "1, 2", False),
        (r"\boxed{-21}", "-2, 1", False),
        ("The answer is 1,2.", "12", False),
        ("So the point is (3,5)", "35", False),
        (r"\boxed{357}", "3, 5, 7", False),
        (r"\boxed{3, 5}", "35", False),
        (r"\boxed{2, 3}", "3", False),
        (r"\boxed{12,34}", "1234", False),  # not the 1,234 pattern
        (r"\boxed{1,2345}", "12345", False),
        ("The answer is 1,234.", "1234", True),
        ("1,234", "1234", True),
        (r"\boxed{1,234,567}", "1234567", True),
        ("#### 1,234", "1234", True),
        (r"\boxed{(3,5)}", "(3, 5)", True),
    ],
    # A gold that is a list is compared as one; several boxes in the final sentence form the list.
    "lists_and_several_boxes": [
        (r"$\boxed{3}, \boxed{5}, \boxed{7}$", "3, 5, 7", True),
        (r"n = \boxed{1}, \boxed{-2}", "1,-2", True),
        (r"\boxed{3, 5, 7}", "3, 5, 7", True),
        (r"The roots are $\boxed{-2}$ and $\boxed{1}$.", "-2, 1", True),
        (r"$\boxed{3}, \boxed{5}$", "3, 5, 7", False),  # a part of the list
        (r"\boxed{7}", "3, 5, 7", False),
        (r"$\boxed{3}, \boxed{5}, \boxed{8}$", "3, 5, 7", False),
        (r"n = \boxed{1}, \boxed{2}", "1,-2", False),
    ],
    # A chained result: the last side of the chain is the answer.
    "chained_result": [
        (r"The answer is $x = 5+5+1 = 11$.", "11", True),
        (r"\boxed{x = 409+83 = 492}", "492", True),
        (r"\boxed{409 + 83 = 492}", "492", True),
        ("409 + 83 = 492", "492", True),
        (r"\boxed{x = 5}", "5", True),
        (r"\boxed{x = 409+83 = 491}", "492", False),
        (r"The answer is $x = 5+5+1 = 12$.", "11", False),
    ],
    # "Answer" followed by display maths on its own lines.
    "display_math_after_answer": [
        ("Answer \\[ \n 9 \n \\]", "9", True),
        ("Answer $$ \n 9 \n $$", "9", True),
        ("Answer:\n\\[\n\\frac{1}{2}\n\\]", "0.5", True),
        ("Answer \\[ \n 8 \n \\]", "9", False),
    ],
    # The usual ways of marking an answer, right and wrong.
    "usual_styles": [
        (r"so $x = \boxed{42}$", "42", True),
        ("The answer is 42.", "42", True),
        ("<answer>42</answer>", "42", True),
        ("<think>6 * 7</think> <answer>42</answer>", "42", True),
        ("Natalia sold 48 / 2 = 24 clips in May.\n#### 42", "42", True),
        ("Answer: 42", "42", True),
        ("The final answer is $42$.", "42", True),
        (r"\boxed{\frac{3}{4}}", "0.75", True),  # a decimal side compared to 6 places
        (r"\boxed{\dfrac{1}{2}}", r"\frac12", True),
        (r"\boxed{[1, 3)}", "[1,3)", True),
        (r"\boxed{(-\infty, 2]}", r"(-\infty,2]", True),
        (r"\boxed{2\sqrt{5}}", r"\sqrt{20}", True),
        (r"\boxed{\sqrt{20}}", r"2\sqrt{5}", True),
        (r"\boxed{41}", "42", False),
        ("#### 41", "42", False),
        ("<answer>-42</answer>", "42", False),
        ("The answer is 4.2.", "42", False),
        (r"\boxed{\frac{4}{3}}", "0.75", False),
        (r"\boxed{(1, 3]}", "[1,3)", False),
        (r"\boxed{4\sqrt{5}}", r"\sqrt{20}", False),
        (r"\boxed{\sqrt{5}}", r"2\sqrt{5}", False),
    ],
    # One final answer per completion: boxes, answer tags and #### that disagree are a hedge, no
    # answer, whichever holds the gold; the same answer marked twice is one answer.
    "several_marked_answers": [
        (r"\boxed{3}. Hmm, or maybe \boxed{5}.", "5", False),
        (r"\boxed{3}. Hmm, or maybe \boxed{5}.", "3", False),
        (r"\boxed{5} or \boxed{3}", "5", False),
        ("<answer>8</answer> <answer>9</answer>", "9", False),
        (r"<think>so \boxed{7}</think> <answer>8</answer>", "8", False),
        (r"<think>so \boxed{7}</think> <answer>8</answer>", "7", False),
        (r"\boxed{8}. Wait, actually the answer is 9.", "9", False),  # a box, then a line stating another value
        ("Natalia sold 40.\n#### 41\n#### 42", "42", False),
        (r"<think>so \boxed{8}</think> <answer>8</answer>", "8", True),
        (r"\boxed{\frac{1}{2}}, so the answer is 1/2.", "0.5", True),
        (r"The answer is 8. Let me check: 4 + 5 = 9. \boxed{9}", "9", True),  # a box corrects an earlier line
    ],
    # A later answer line corrects an earlier one: the last is the final answer.
    "self_correction": [
        ("the answer is 8. Wait, no, the answer is 9.", "9", True),
        ("the answer is 8. Wait, no, the answer is 9.", "8", False),
        ("Answer: 8\nHmm, recheck. Answer: 9", "9", True),
    ],
    # A negated or retracted final answer is no answer.
    "negated_or_retracted": [
        (r"the answer is not \boxed{18}", "18", False),
        (r"It cannot be $\boxed{18}$.", "18", False),
        (r"\boxed{18} is wrong.", "18", False),
        (r"\boxed{18}. Wait, no.", "18", False),
        ("<answer>18</answer> That is incorrect.", "18", False),
        ("The answer is not 18.", "18", False),
        (r"So there are $\boxed{18}$ ways, not 20.", "18", True),
        (r"\boxed{18}. Wait, let me check: 9 + 9 = 18. Yes.", "18", True),
    ],
    # Numbers inside a fenced code block are not answers.
    "code_blocks": [
        ("```python\nprint(17 + 25)\n# 42\n```", "42", False),
        ("```\n\\boxed{42}\n```", "42", False),
        ("```python\nx = 17 + 25\n```\nThe answer is 42.", "42", True),
        ("```python\nprint(17 + 25)\n```\nSo the total is 42", "42", True),
    ],
    # Other scripts' digits, superscripts, vulgar fractions, zero-width characters and dashes other
    # than the minus sign are read as what they are or refused, never dropped.
    "lookalike_characters": [
        ("\\boxed{\uff14\uff12}", "42", False),  # fullwidth digits
        ("\\boxed{\u0664\u0662}", "42", False),  # Arabic-Indic digits
        ("\\boxed{4\u200b2}", "42", False),  # a zero-width space
        ("\\boxed{4\u00b2}", "4", False),  # 4 squared
        ("\\boxed{4\u00b2}", "42", False),
        ("\\boxed{2\u00bd}", "2", False),  # two and a half
        ("4\u00b2", "4", False),
        ("4\u200b2", "2", False),
        ("\u221211", "11", False),  # U+2212 is a minus sign
        ("\u221211", "-11", True),
        ("\uff0d11", "11", False),  # a fullwidth hyphen-minus is not read as anything
        ("The answer is \u22127.", "-7", True),
        ("So the total is \\\u200b$18.90", "\\$18.90", False),  # behind a currency sign: beside it still
        ("So the total is \\$18.90", "\\$18.90", True),
        ("It costs \u20ac\u200b42", "42", False),
        ("It costs \u20ac42", "42", True),
    ],
    # A number written in a base is that base's number: another base's digits are another number
    # (math-verify drops the subscript and pays them).
    "bases": [
        (r"$\boxed{52_9}$", "52_8", False),
        (r"$\boxed{2516_{10}}$", "2516_8", False),
        (r"$\boxed{52_9}, \boxed{52_8}$", "52_8", False),  # a hedge over two bases
        (r"$\boxed{52_8}$", "52", False),  # the gold is in base 10
        (r"$\boxed{52_8}$", "52_8", True),
        (r"$\boxed{4210_{5}}$", "4210_5", True),
        (r"$\boxed{52}$", "52_8", True),  # the digits the question asked for
        (r"$\boxed{52_{10}}$", "52", True),
        (r"$\boxed{x_1 = 3}$", "3", True),  # a variable's subscript is no base
    ],
    # Several boxes of one sentence are a list: for a gold of one value, a hedge (math-verify reads
    # the first where units follow the numbers).
    "a_list_for_one_value": [
        (r"$\boxed{5.4 \text{ cents}}, \boxed{5.5 \text{ cents}}$", r"5.4 \text{ cents}", False),
        (r"$\boxed{\frac{270}7\text{ degrees}}, \boxed{\frac{270}8\text{ degrees}}$", r"\frac{270}7\text{ degrees}", False),
        (r"$\boxed{3}, \boxed{5}$", "3", False),
        (r"$\boxed{3}, \boxed{5}$", "3, 5", True),
        (r"$\boxed{5.4 \text{ cents}}$", r"5.4 \text{ cents}", True),
        (r"\boxed{1,234}", "1234", True),  # a thousands separator, not a list
        (r"\boxed{11,\! 111,\! 100}", "11111100", True),  # one written with spaces, as MATH-500 does
        # An exponent's or subscript's digit before the comma starts no number: a list.
        (r"$\boxed{864 \mbox{ inches}^3}, \boxed{864 \mbox{ inches}^2}$", r"864 \mbox{ inches}^3", False),
        (r"$\boxed{x_1, 234}$", "x_1", False),
    ],
    # A percentage is read once: its number over 100; a bare number in the question's units.
    "percentages_read_once": [
        ("The answer is 45%.", "0.45", True),
        ("The answer is 45%.", "45", False),
        (r"\boxed{45\%}", "45", False),
        (r"\boxed{0.45}", r"45\%", True),
        ("So the total is 45%", "45", False),  # unmarked, read as marked answers are
        ("So the total is 45%", "0.45", True),
        ("So the total is 45 \\%", r"45\%", True),
    ],
    # On the default task, an unmarked number with a hedge or relation beside it is no answer.
    "unmarked_hedges": [
        ("11 or more", "11", False),
        ("less than 11", "11", False),
        ("not 11", "11", False),
        ("about 11", "11", False),
        ("12 or 11", "11", False),
        ("< 11", "11", False),
        ("It is 11", "11", True),
        ("Adding 5 and 6 gives 11", "11", True),
    ],
    # A restated question is not an answer, even where its last number equals the result.
    "restated_question": [
        ("0 + 5 =", "5", False),
        ("8 - 4 =", "4", False),
        ("6 - 3 =", "3", False),
        ("1 * 1 =", "1", False),
        ("The answer is 409 + 83", "492", False),
        (r"\boxed{409 + 83}", "492", False),
        ("8 - 4 = 4", "4", True),
        ("0 + 5 = 5", "5", True),
        ("8 - 4 = 5", "4", False),
    ],
    # Digits written apart, or a point before them, are another number: 1 8 is neither 18 nor the
    # 9 math-verify reads; .3√2 is a tenth of 3√2.
    "digits_apart_or_shifted": [
        (r"So she makes $\boxed{1 8}$ dollars.", "18", False),
        (r"\boxed{1 8}", "9", False),
        (r"\boxed{3 5}", "35", False),
        ("The answer is 20 16.", "2016", False),
        (r"\boxed{\frac{1 4}{3}}", r"\frac{14}{3}", False),
        (r"\boxed{x + 1 0}", "x+10", False),
        (r"\boxed{.3\sqrt{2}}", r"3\sqrt{2}", False),
        (r"\boxed{.3\sqrt{2}}", r"\frac{3\sqrt{2}}{10}", True),  # 0.3 * sqrt(2)
        (r"\boxed{.5x}", "5x", False),
        (r"\boxed{..3\sqrt{2}}", r"3\sqrt{2}", False),
        (r"\boxed{10,\!080}", r"10,\!080", True),
        (r"\boxed{10, \!080}", r"10,\!080", True),  # a thousands separator with a space after it
    ],
    # A word beside a number that changes or qualifies its value: a number word, a scale, a
    # constant, a range or a qualifier. A unit of what is counted stays a unit.
    "value_words": [
        ("The answer is 3 pi.", "3", False),  # 3π
        (r"\boxed{3 \text{ pi}}", "3", False),
        ("The answer is 2 to the tenth.", "2", False),  # 1024
        ("The answer is 5 point five.", "5", False),  # 5.5
        ("The answer is 0.3 repeating.", "0.3", False),  # 1/3
        ("The answer is 3 quarters.", "3", False),  # 0.75
        ("The answer is 3 halves.", "3", False),  # 1.5
        ("The answer is 7 tenths.", "7", False),  # 0.7
        ("The answer is 3 score.", "3", False),  # 60
        ("The answer is 4 degrees below.", "4", False),  # -4
        ("The answer is 12ish.", "12", False),
        ("The answer is 12 max.", "12", False),
        ("The answer is 12 odd.", "12", False),  # twelve or so
        ("The answer is 2 trillion.", "2", False),
        (r"\boxed{2 \text{ trillion}}", "2", False),
        (r"\boxed{12 \text{ grand}}", "12", False),  # 12,000
        (r"\boxed{12 \text{ tops}}", "12", False),
        ("The answer is 18 dollars.", "18", True),
        ("The answer is 5 feet per second.", "5", True),
        ("So the total comes to 18", "18", True),  # unmarked: "to" before it is the sentence's
    ],
    # A relation, an approximation or a question mark is not the value.
    "relations_and_approximations": [
        (r"\boxed{\lesssim 12}", "12", False),
        (r"\boxed{\leqslant 12}", "12", False),
        (r"\boxed{\approxeq 12}", "12", False),
        (r"\boxed{\cong 12}", "12", False),
        ("The answer is \u2a7d 12.", "12", False),  # ⩽
        ("The answer is \u2272 12.", "12", False),  # ≲
        ("The answer is \u2248 12.", "12", False),  # ≈
        (r"\boxed{12\text{?}}", "12", False),
        (r"\boxed{\neg 12}", "12", False),
        (r"\boxed{12 \text{ per cent}}", "12", False),
        ("The answer is 12 pct.", "12", False),
        ("The answer is 12\uff05.", "12", False),  # a fullwidth percent sign
        ("The answer is 12\u2030.", "12", False),  # per mille
    ],
    # Two values in one answer, each a way to write one of two candidates: paid under neither.
    "two_values_in_one_answer": [
        (completion, gold, False)
        for completion in [r"\boxed{3 \lor 5}", r"\boxed{3 \vee 5}", r"\boxed{3 | 5}", r"\boxed{3 \mid 5}",
                           r"\boxed{3 \\ 5}", r"\boxed{x=3 \\ x=5}", r"\boxed{3 = 5}", r"\boxed{3 \equiv 5}",
                           r"\boxed{3 \text{, } 5}", r"\boxed{\cancel{3} 5}", r"\boxed{\color{white}{3} 5}",
                           r"\boxed{\hbox{3} 5}", r"\boxed{\not3 5}", r"\boxed{3\ \&\ 5}", r"\boxed{3 \to 5}",
                           r"\boxed{3 \rightarrow 5}", r"\boxed{3 \Rightarrow 5}", r"\boxed{3 \implies 5}",
                           r"\boxed{3 \iff 5}", r"\boxed{3 \text{ (}5\text{)}}", r"\boxed{3 \text{ (5?)}}",
                           r"\boxed{3 \text{ [5]}}", r"\boxed{3 \text{ / 5}}", "The answer is 3\\5.",
                           "The answer is $3$ $ 5$.", "The answer is $3$; $5$.", "3; 5", "3 | 5",
                           "<answer>\\boxed{3} 5</answer>"]
        for gold in ("3", "5")
    ] + [
        # the second value a number the reading already holds, or a number sympy writes itself
        # (an integer's denominator 1, the 1 of pi/2, a negation's -1), or a choice's letter
        (r"\boxed{0 \text{ (}1\text{)}}", "0", False),
        (r"\boxed{1 \lor 0}", "0", False),
        (r"\boxed{\cancel{1} 0}", "0", False),
        (r"\boxed{\frac{3}{2} \text{ (}\frac{3}{3}\text{)}}", r"\frac{3}{2}", False),
        (r"\boxed{3, 5, 7 \text{ (}3\text{)}}", "3, 5, 7", False),
        (r"\boxed{(3,4] \text{ (}1\text{)}}", "(3,4]", False),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right) \text{ (}3\text{)}}", r"\left( 3, \frac{\pi}{2} \right)", False),
        (r"\boxed{\left( 3, \frac{\pi}{2} \right) \text{ (}1\text{)}}", r"\left( 3, \frac{\pi}{2} \right)", False),
        (r"\boxed{6r^2-4r-24 \text{ (}1\text{)}}", "6r^2-4r-24", False),
        (r"\boxed{5r^5 \text{ (}1\text{)}}", "5r^5", False),
        (r"\boxed{x \in [-2,7] \text{ (}1\text{)}}", r"x \in [-2,7]", False),
        (r"\boxed{\left(\frac{3}{5},\frac{8}{3}\right] \text{ (}\text{(C)}\text{)}}", r"\left(\frac{3}{5},\frac{8}{3}\right]", False),
        (r"\boxed{\text{(C)} = \left(\frac{3}{5},\frac{8}{3}\right]}", r"\left(\frac{3}{5},\frac{8}{3}\right]", False),
        (r"\boxed{\phantom{0} 5}", "5", False),  # math-verify reads 0 + 5
        (r"<answer>\boxed{(3,4]} \text{(C)}</answer>", "(3,4]", False),
        (r"<answer>\boxed{\text{(C)}}</answer>", r"\text{(C)}", True),
        # each number once, as the reading holds it: paid
        (r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)", True),
        (r"\boxed{-x + 1}", "1 - x", True),
        (r"\boxed{\frac{\pi}{8}}", r"\frac{1}{8}\pi", True),
        (r"\boxed{3, 3, 5}", "3, 5", True),
        (r"\boxed{\text{(C)}}", r"\text{(C)}", True),
    ],
    # An equation is a result where it is true, or where it defines a variable.
    "equations_between_numbers": [
        (r"\boxed{3\sqrt{2} = 4\sqrt{2}}", r"4\sqrt{2}", False),
        (r"\boxed{\frac{1}{3} = \frac{1}{2}}", r"\frac{1}{2}", False),
        (r"\boxed{2^{10} = 1000}", "1000", False),
        (r"\boxed{2^{10} = 1024}", "1024", True),
        (r"\boxed{x = 3\sqrt{2}}", r"3\sqrt{2}", True),
        # with variables: an identity, or a definition (a lone variable on the left), is a result
        (r"\boxed{15x - 81 = 15x - 80}", "15x - 80", False),
        (r"\boxed{6r^2-4r-27 = 6r^2-4r-24}", "6r^2-4r-24", False),
        (r"\boxed{1+3i = 1+2i}", "1+2i", False),
        (r"\boxed{\begin{pmatrix} 1 \\ 9 \end{pmatrix} = \begin{pmatrix} 1 \\ 7 \end{pmatrix}}",
         r"\begin{pmatrix} 1 \\ 7 \end{pmatrix}", False),
        (r"\boxed{y = 15x - 80}", "15x - 80", True),
        (r"\boxed{(x+1)^2 = x^2 + 2x + 1}", "x^2 + 2x + 1", True),
        (r"\boxed{x^2 + y^2 = 25}", "x^2 + y^2 = 25", True),
        # a matrix equal to a number, and an equation inside a list
        (r"\boxed{15 = \begin{pmatrix} -2 \\ -14 \\ -7 \end{pmatrix}}", r"\begin{pmatrix} -2 \\ -14 \\ -7 \end{pmatrix}", False),
        (r"\boxed{\begin{pmatrix} -18 \\ -49 \\ 96 \end{pmatrix} = \pi}", r"\pi", False),
        (r"\boxed{\frac{\sqrt{3}}{3} = 1,-2}", "1,-2", False),
        (r"\boxed{\mathbf{v} = \begin{pmatrix} 1 \\ 7 \end{pmatrix}}", r"\begin{pmatrix} 1 \\ 7 \end{pmatrix}", True),
    ],
    # A committed answer and another value after it: a second candidate, paid under neither.
    "second_value_after_commitment": [
        (completion.format(a=a, b=b), gold, False)
        for completion in ["The answer is {a}. Or maybe {b}.", "The answer is {a}. Could also be {b}.",
                           "\\boxed{{{a}}}. Could also be {b}.", "\\boxed{{{a}}}, or possibly {b}.",
                           "\\boxed{{{a}}}. So the answer is {b} apples.", "\\boxed{{{a}}}. The answer is $x = {b}$.",
                           "#### {a}\nThe answer is {b} dollars.", "<answer>{a}</answer> Final answer: {b} eggs"]
        for a, b in [("5", "6")]
        for gold in (a, b)
    ] + [
        (r"\boxed{5}. So the answer is 5 apples.", "5", True),
        (r"\boxed{6}. The answer is $x = 6$.", "6", True),
        (r"\boxed{18}, or 18 dollars.", "18", True),
    ],
}

CASES = graded_cases(CLASSES)


@pytest.mark.parametrize("completion,gold,should_pay", CASES)
def test_answer_matches(completion, gold, should_pay):
    assert answer_matches(completion, gold) is should_pay


@pytest.mark.parametrize("name", list(CLASSES))
def test_accuracy_reward_in_batch(name):
    """The same cases in one batch (the fast path and the pool together), as the trainer scores."""
    completions, golds, pays = zip(*CLASSES[name])
    expected = [1.0 if pay else 0.0 for pay in pays]
    assert accuracy_reward(list(completions), list(golds)) == expected


# --------------------------------------------------------------------------- the arithmetic task


def _task_scores(task, completions: list[str]) -> list[float]:
    """The task's reward path: accuracy_reward with the problems' answer and entry columns."""
    return accuracy_reward(completions, [p.answer for p in task.test], [p.entry for p in task.test])


@pytest.mark.parametrize("operations", ["+", "+-*"], ids=["default", "all_operations"])
def test_arithmetic_task_never_pays_the_restated_question(operations):
    """The default task's held-out problems ``a + b =`` (and with - and *): the question written
    back is never paid, even where its last number is the result (0 + 5 = for 5); the question
    with its result stated is always paid."""
    task = arithmetic(digits=1, operations=operations, test_size=200, seed=0)
    tempting = [p for p in task.test if p.question.rstrip(" =").split()[-1] == p.answer]
    assert tempting, "the held-out set has no question whose last number is its result"
    assert _task_scores(task, [p.question for p in task.test]) == [0.0] * len(task.test)
    assert _task_scores(task, [f"{p.question} {p.answer}" for p in task.test]) == [1.0] * len(task.test)
    assert _task_scores(task, [p.answer for p in task.test]) == [1.0] * len(task.test)


# --------------------------------------------------------------------------- reasoning-gym tasks

needs_gym = pytest.mark.skipif(importlib.util.find_spec("reasoning_gym") is None, reason="needs reasoning-gym")


@lru_cache(maxsize=None)
def _gym(dataset: str, test_size: int = 20):
    from podsrl.tasks.gym import gym_task

    return gym_task(dataset=dataset, test_size=test_size, seed=0)


def _gym_scores(problem, completions: list[str]) -> list[float]:
    """The gym task's reward path: the problem's gold and its entry, per completion."""
    return accuracy_reward(completions, [problem.answer] * len(completions), [problem.entry] * len(completions))


def _numeric_problem(dataset: str):
    """A held-out problem whose gold is a positive integer (so that -g, g1 and 1g are other numbers)."""
    problem = next((p for p in _gym(dataset).test if p.answer.isdigit() and int(p.answer) > 0), None)
    assert problem is not None, f"{dataset}: no held-out problem with a positive integer gold"
    return problem


def _wrong_numbers(gold: str) -> list[str]:
    """Other numbers that contain the gold's digits: its negation, digits appended or prepended."""
    return [f"-{gold}", f"{gold}1", f"1{gold}", f"<answer>-{gold}</answer>", f"<answer>{gold}1</answer>",
            f"The answer is -{gold}.", rf"\boxed{{1{gold}}}"]


@needs_gym
@pytest.mark.parametrize("dataset", ["letter_counting", "count_bits", "chain_sum"])
def test_gym_wrong_number_scores_zero(dataset):
    """A wrong number scores 0, although the data set's verifier credits a longer answer that
    contains the gold (letter_counting, count_bits) or a sign flip (chain_sum) in part."""
    problem = _numeric_problem(dataset)
    wrong = _wrong_numbers(problem.answer)
    assert _gym_scores(problem, wrong) == [0.0] * len(wrong), list(zip(wrong, _gym_scores(problem, wrong)))
    assert _gym_scores(problem, [problem.answer, f"<answer>{problem.answer}</answer>"]) == [1.0, 1.0]


@needs_gym
def test_gym_symbolic_sign_flip_is_not_solved():
    """gsm_symbolic's verifier reads the digits after a minus sign; -g is as wrong as g + 1 and
    earns no more than it (the data set's own credit for a wrong number, at most)."""
    problem = _numeric_problem("gsm_symbolic")
    other = str(int(problem.answer) + 1)
    [floor] = _gym_scores(problem, [other])
    assert floor < 1.0
    wrong = _wrong_numbers(problem.answer)
    scores = _gym_scores(problem, wrong)
    assert all(s <= floor for s in scores), list(zip(wrong, scores))
    assert _gym_scores(problem, [problem.answer]) == [1.0]


@needs_gym
@pytest.mark.parametrize("dataset", ["list_functions", "base_conversion"])
def test_gym_credit_for_holding_the_gold_among_other_text_is_not_paid(dataset):
    """A data set's verifier credits an answer holding the gold inside longer text with the gold's
    share of its length (``not G``, ``G or H``, ``GH``), which pays a hedge more than committing
    to one answer: podsrl pays it nothing, nor an answer tag retracted or followed by another."""
    from podsrl.tasks.gym import _verifier

    problem = _gym(dataset).test[0]
    gold, other = problem.answer, "[9, 9, 9]" if dataset == "list_functions" else "777"
    hedges = [f"not {gold}", f"{gold} or {other}", f"{gold}{other}", f"{other}{gold}", f"{gold}0"]
    raw = [_verifier(problem.entry["dataset"], problem.entry["config"])(h, problem.entry["entry"]) for h in hedges]
    assert min(raw) > 0.1, f"the verifier no longer credits these in part: {dict(zip(hedges, raw))}"
    tagged = [f"<answer>{h}</answer>" for h in hedges]
    withdrawn = [f"<answer>{gold}</answer> is wrong", f"<answer>{gold}</answer> Wait, no.",
                 f"<answer>{gold}</answer> or maybe {other}", f"<answer>{gold}</answer>, or possibly {other}"]
    assert _gym_scores(problem, hedges + tagged + withdrawn) == [0.0] * (2 * len(hedges) + len(withdrawn))
    assert _gym_scores(problem, [gold, f"<answer>{gold}</answer>", f"<answer>{gold}</answer> That is all."]) == [1.0] * 3


def _as_written(gold: str) -> list[str]:
    """A multi-line answer as a model writes it: the reply alone, in answer tags, in tags on lines
    of their own, after a line of reasoning inside tags."""
    return [gold, f"{gold}\n", f"<answer>{gold}</answer>", f"<answer>\n{gold}\n</answer>",
            f"<think>Rotate it.</think>\n<answer>\n{gold}\n</answer>"]


# The data sets whose golds span lines and whose defaults gym_task accepts (futoshiki's generator
# takes minutes for a held-out set; tower_of_hanoi's defaults give too few distinct questions).
MULTILINE = ["arc_agi", "kakurasu", "manipulate_matrix", "mini_sudoku", "modulo_grid", "n_queens", "pool_matrix",
             "rearc", "rotate_matrix", "sudoku", "survo"]
SLOW_GENERATORS = {"rearc", "sudoku"}  # 10 s and 30 s for their problems


@needs_gym
@pytest.mark.parametrize("dataset", [pytest.param(d, marks=pytest.mark.slow) if d in SLOW_GENERATORS else d
                                     for d in MULTILINE])
def test_gym_multiline_answer_exactly_right_scores_one(dataset):
    """The gold itself, as the reply or in answer tags, scores 1; with one entry changed, it does not."""
    problems = [p for p in _gym(dataset, 3).test if "\n" in p.answer.strip()]
    assert problems, f"{dataset}: no held-out gold spans lines"
    for problem in problems:
        written = _as_written(problem.answer)
        assert _gym_scores(problem, written) == [1.0] * len(written), list(zip(written, _gym_scores(problem, written)))
        lines = problem.answer.split("\n")
        first = lines[0].split(" ")
        first[0] = "1" if first[0] != "1" else "2"  # one entry changed
        wrong = "\n".join([" ".join(first), *lines[1:]])
        assert _gym_scores(problem, [wrong, f"<answer>{wrong}</answer>"]) != [1.0, 1.0]


@needs_gym
@pytest.mark.parametrize("dataset,test_size", [("caesar_cipher", 40), ("emoji_mystery", 200)])
def test_gym_gold_containing_the_word_answer_is_not_cut(dataset, test_size):
    """A gold holding "answer" (``ANSWERED THE FACE ...``, ``'Yes,' answers Dr.``) given whole scores 1."""
    task = _gym(dataset, test_size)
    problem = next((p for p in task.test if "answer" in p.answer.lower()), None)
    assert problem is not None, f"{dataset}: no held-out gold holds the word answer"
    written = [problem.answer, f"<answer>{problem.answer}</answer>"]
    assert _gym_scores(problem, written) == [1.0, 1.0], list(zip(written, _gym_scores(problem, written)))


def test_an_echo_of_the_questions_numbers_is_no_answer():
    """The numbers of the question written back, its digits inside a fraction included, state no
    result; the same number after a result word does."""
    question = "Harry slept 9 hours. James slept only 2/3 of what Harry slept. How many more hours?"
    assert accuracy_reward(["9 2 3", "9 3", "2 3"], ["3"] * 3, question=[question] * 3) == [0.0] * 3
    assert accuracy_reward(["So the difference is 3"], ["3"], question=[question]) == [1.0]
