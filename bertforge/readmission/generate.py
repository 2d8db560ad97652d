"""Write MIMIC-III-shaped ADMISSIONS and NOTEEVENTS CSVs that are clearly not MIMIC-III data.

For tests and demos without PhysioNet access. The files carry the real column lists (MIMIC-III
v1.4), "GENERATED" in their names, a README, "GENERATED: " before every DIAGNOSIS and the line
"GENERATED — not MIMIC-III data" at the top of every note.

How readmission depends on the text: each patient has a frailty, and each admission a latent risk
(frailty plus noise). The risk drives both the chance of a non-elective readmission within 30 days
and the chance that each of a dozen risk phrases ("chf exacerbation", "noncompliance", "left
against medical advice", "discharged home without services", ...) appears, and, the other way,
each protective phrase. Everything else (diagnoses, labs, medication lists, hospital course) is
drawn at random, and the label is noisy given the risk (a readmission may be elective, or beyond
the fourth admission), so a bag-of-words model reaches an AUROC of about 0.7-0.8 on discharge
summaries, not 1.0; early nursing and physician notes carry a weaker signal. Measured with
logistic regression on binary unigrams and bigrams, 2,000 patients, 5 folds by patient, C from
0.03 to 1: AUROC 0.71-0.78 for discharge summaries, 0.60-0.69 for early-2, 0.65-0.72 for early-3
(about 19% of admissions are positives).
"""
import csv
import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from ..atomic import replaced_file, write_text

GENERATED_MARK = "GENERATED — not MIMIC-III data"
ADMISSIONS_HEADER = ("ROW_ID", "SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME", "ADMISSION_TYPE",
                     "ADMISSION_LOCATION", "DISCHARGE_LOCATION", "INSURANCE", "LANGUAGE", "RELIGION",
                     "MARITAL_STATUS", "ETHNICITY", "EDREGTIME", "EDOUTTIME", "DIAGNOSIS", "HOSPITAL_EXPIRE_FLAG",
                     "HAS_CHARTEVENTS_DATA")
NOTEEVENTS_HEADER = ("ROW_ID", "SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "STORETIME", "CATEGORY",
                     "DESCRIPTION", "CGID", "ISERROR", "TEXT")
_TIME = "%Y-%m-%d %H:%M:%S"

# (diagnosis, chief complaint, service, share of the risk it adds)
_CONDITIONS = [
    ("CONGESTIVE HEART FAILURE", "shortness of breath", "MEDICINE", 0.6),
    ("COPD EXACERBATION", "dyspnea and cough", "MEDICINE", 0.5),
    ("PNEUMONIA", "fever and productive cough", "MEDICINE", 0.0),
    ("URINARY TRACT INFECTION;SEPSIS", "fever and confusion", "MEDICINE", 0.1),
    ("GASTROINTESTINAL BLEED", "melena", "MEDICINE", 0.2),
    ("NON ST SEGMENT ELEVATION MYOCARDIAL INFARCTION", "chest pain", "CARDIOLOGY", 0.0),
    ("CIRRHOSIS WITH ASCITES", "abdominal distension", "MEDICINE", 0.6),
    ("DIABETIC KETOACIDOSIS", "nausea and vomiting", "MEDICINE", 0.3),
    ("CELLULITIS", "leg redness and swelling", "MEDICINE", -0.3),
    ("SYNCOPE", "loss of consciousness", "MEDICINE", -0.3),
    ("HIP FRACTURE", "fall with hip pain", "ORTHOPAEDICS", -0.2),
    ("CORONARY ARTERY DISEASE", "exertional angina", "CARDIAC SURGERY", -0.5),
]
_RISK_PHRASES = [
    "chf exacerbation", "history of noncompliance with medications and diet", "patient left against medical advice",
    "multiple comorbidities including ckd and diabetes", "discharged home without services",
    "poor social support and lives alone", "ongoing alcohol use", "missed several follow up appointments",
    "persistent volume overload at discharge", "creatinine remained elevated", "declined rehab placement",
    "still requiring supplemental oxygen", "multiple prior admissions this year",
]
_PROTECTIVE_PHRASES = [
    "lives with supportive family", "follow up arranged with pcp within one week", "visiting nurse services arranged",
    "ambulating independently and tolerating regular diet", "clinically improved and back to baseline",
    "adherent to home medications", "symptoms fully resolved", "euvolemic on discharge exam",
    "good understanding of the discharge plan", "first hospitalization",
]
_FILLER = [
    "The patient was seen and examined with the team.", "Vital signs remained stable overnight.",
    "Labs were notable for a mild anemia which remained stable.", "Electrolytes were repleted as needed.",
    "Blood cultures showed no growth to date.", "Physical therapy evaluated the patient.",
    "The patient was continued on home medications where appropriate.", "Pain was controlled with oral agents.",
    "A chest radiograph showed no acute cardiopulmonary process.", "Glucose was managed with an insulin sliding scale.",
    "Telemetry showed sinus rhythm without events.", "The patient remained afebrile.",
    "Urine output was adequate.", "Diet was advanced as tolerated.", "Case management was consulted.",
    "The patient received DVT prophylaxis with subcutaneous heparin.", "Blood pressure was well controlled.",
    "Antibiotics were narrowed based on culture data.", "Renal function was monitored daily.",
    "The family was updated at the bedside.", "An echocardiogram was obtained.",
    "The patient was transitioned to oral medications.", "Oxygen saturation remained above 92 percent.",
]
_MEDICATIONS = [
    "Aspirin 81 mg Tablet, Chewable Sig: One (1) Tablet, Chewable PO DAILY (Daily).",
    "Furosemide 40 mg Tablet Sig: One (1) Tablet PO DAILY (Daily).",
    "Metoprolol Tartrate 25 mg Tablet Sig: One (1) Tablet PO BID (2 times a day).",
    "Lisinopril 10 mg Tablet Sig: One (1) Tablet PO DAILY (Daily).",
    "Atorvastatin 40 mg Tablet Sig: One (1) Tablet PO DAILY (Daily).",
    "Pantoprazole 40 mg Tablet, Delayed Release (E.C.) Sig: One (1) Tablet PO Q24H (every 24 hours).",
    "Insulin Glargine 100 unit/mL Solution Sig: Twenty (20) units Subcutaneous at bedtime.",
    "Levofloxacin 750 mg Tablet Sig: One (1) Tablet PO Q24H (every 24 hours) for 5 days.",
    "Albuterol Sulfate 90 mcg/Actuation HFA Aerosol Inhaler Sig: Two (2) Puff Inhalation Q4H as needed.",
    "Docusate Sodium 100 mg Capsule Sig: One (1) Capsule PO BID (2 times a day).",
    "Acetaminophen 325 mg Tablet Sig: Two (2) Tablet PO Q6H (every 6 hours) as needed for pain.",
    "Spironolactone 25 mg Tablet Sig: One (1) Tablet PO DAILY (Daily).",
    "Lactulose 10 gram/15 mL Syrup Sig: Thirty (30) ML PO TID (3 times a day).",
    "Warfarin 5 mg Tablet Sig: One (1) Tablet PO once a day.",
]
_CATEGORIES_PER_DAY = [("Nursing/other", "Report"), ("Nursing", "Nursing Progress Note"),
                       ("Physician ", "Physician Resident Progress Note")]


@dataclass(frozen=True)
class GeneratedFiles:
    """Paths of the generated files; `injected` maps `Report` keys to the bad rows put in on purpose."""
    admissions: Path
    noteevents: Path
    readme: Path
    injected: dict[str, int] = field(default_factory=dict)


def generate_mimic(output_dir: str | os.PathLike, n_patients: int = 300, seed: int = 0,
                   inject_errors: bool = False) -> GeneratedFiles:
    """Write ADMISSIONS_GENERATED.csv, NOTEEVENTS_GENERATED.csv and README.txt under `output_dir`.

    Patients have 1 to 4 admissions (EMERGENCY, URGENT, ELECTIVE; about 8% are single NEWBORN
    stays; about 4% of stays end in death); every admission has notes. With `inject_errors`, adds
    one note with an unknown HADM_ID, one with no HADM_ID, one with an unparseable CHARTDATE, one
    admission with an unparseable ADMITTIME and one admission without notes.
    Raises ValueError for n_patients < 1.
    """
    if n_patients < 1:
        raise ValueError(f"n_patients must be at least 1, got {n_patients}")
    rng = np.random.default_rng(seed)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    admissions, notes = [], []
    hadm_id = 100000
    for subject_id in range(1, n_patients + 1):
        for stay in _patient_stays(rng):
            hadm_id += 1
            admissions.append(_admission_row(rng, subject_id, hadm_id, stay))
            notes.extend(_stay_notes(rng, subject_id, hadm_id, stay))

    injected = {}
    if inject_errors:
        injected = _inject_errors(admissions, notes, n_patients, hadm_id)

    paths = GeneratedFiles(output_dir / "ADMISSIONS_GENERATED.csv", output_dir / "NOTEEVENTS_GENERATED.csv",
                           output_dir / "README.txt", injected)
    _write(paths.admissions, ADMISSIONS_HEADER, admissions)
    _write(paths.noteevents, NOTEEVENTS_HEADER, notes)
    write_text(
        paths.readme, f"{GENERATED_MARK}.\n\nThese files were generated by bertforge.readmission.generate_mimic "
        f"(n_patients={n_patients}, seed={seed}, inject_errors={inject_errors}). They have the columns of "
        "MIMIC-III v1.4 ADMISSIONS and NOTEEVENTS but describe no real patient; every note starts with the line "
        f"'{GENERATED_MARK}'.\n")
    return paths


@dataclass
class _Stay:
    admit_time: datetime
    discharge_time: datetime
    admission_type: str
    risk: float
    condition: tuple
    died: bool


def _patient_stays(rng: np.random.Generator) -> list[_Stay]:
    """A patient's admissions; a riskier stay is more often followed by a readmission within 30 days."""
    # MIMIC-III shifts dates into 2100-2200.
    start = datetime(2100, 1, 1) + timedelta(days=int(rng.integers(0, 95 * 365)), minutes=int(rng.integers(0, 1440)))
    if rng.random() < 0.08:
        return [_Stay(start, start + timedelta(days=float(rng.uniform(1.5, 5))), "NEWBORN", 0.0, None, False)]
    frailty = rng.normal()
    stays, admit_time = [], start
    admission_type = _pick(rng, ["EMERGENCY"] * 15 + ["ELECTIVE"] * 3 + ["URGENT"] * 2)
    while True:
        condition = _CONDITIONS[int(rng.integers(len(_CONDITIONS)))]
        risk = 0.8 * frailty + 0.6 * rng.normal() + condition[3]
        days = float(np.clip(np.exp(rng.normal(1.3, 0.6)) + 0.4 * max(risk, 0), 0.3, 40))
        died = admission_type != "ELECTIVE" and rng.random() < _sigmoid(-3.8 + 0.8 * risk)
        stay = _Stay(admit_time, admit_time + timedelta(days=days), admission_type, risk, condition, died)
        stays.append(stay)
        if died or len(stays) == 4:
            return stays
        if rng.random() < _sigmoid(-2.1 + 1.6 * risk):
            gap = rng.uniform(0.5, 29.5)  # readmitted within 30 days; 1 in 10 planned (elective) anyway
            admission_type = "ELECTIVE" if rng.random() < 0.1 else _pick(rng, ["EMERGENCY"] * 4 + ["URGENT"])
        elif rng.random() < 0.35:
            gap = 30.5 + rng.exponential(300)
            admission_type = _pick(rng, ["EMERGENCY"] * 6 + ["ELECTIVE"] * 3 + ["URGENT"])
        else:
            return stays
        admit_time = stay.discharge_time + timedelta(days=float(gap))


def _admission_row(rng, subject_id: int, hadm_id: int, stay: _Stay) -> list:
    emergency = stay.admission_type == "EMERGENCY"
    location = "EMERGENCY ROOM ADMIT" if emergency else "PHYS REFERRAL/NORMAL DELI"
    diagnosis = "NEWBORN" if stay.condition is None else stay.condition[0]
    discharge_location = ("DEAD/EXPIRED" if stay.died
                          else _pick(rng, ["HOME", "HOME HEALTH CARE", "SNF", "REHAB/DISTINCT PART HOSP"]))
    ed_in = (stay.admit_time - timedelta(hours=float(rng.uniform(2, 8)))).strftime(_TIME) if emergency else ""
    return ["", subject_id, hadm_id, stay.admit_time.strftime(_TIME), stay.discharge_time.strftime(_TIME),
            stay.discharge_time.strftime(_TIME) if stay.died else "", stay.admission_type, location,
            discharge_location, _pick(rng, ["Medicare", "Private", "Medicaid"]), "ENGL",
            _pick(rng, ["CATHOLIC", "PROTESTANT QUAKER", "NOT SPECIFIED"]),
            _pick(rng, ["MARRIED", "SINGLE", "WIDOWED"]),
            _pick(rng, ["WHITE", "BLACK/AFRICAN AMERICAN", "HISPANIC OR LATINO", "ASIAN"]),
            ed_in, stay.admit_time.strftime(_TIME) if emergency else "", f"GENERATED: {diagnosis}",
            int(stay.died), 1]


def _stay_notes(rng, subject_id: int, hadm_id: int, stay: _Stay) -> list[list]:
    """Daily nursing and physician notes, radiology and ECG reports, and the discharge summary."""
    notes = []
    admit_date = stay.admit_time.replace(hour=0, minute=0, second=0)
    days = (stay.discharge_time.date() - stay.admit_time.date()).days
    for day in range(days + 1):
        for category, description in _CATEGORIES_PER_DAY:
            if category.startswith("Physician") and (stay.condition is None or rng.random() < 0.4):
                continue
            when = admit_date + timedelta(days=day, hours=float(rng.uniform(6, 22)))
            when = min(max(when, stay.admit_time), stay.discharge_time)
            text = _progress_note(rng, stay, day)
            notes.append(_note(subject_id, hadm_id, when, when, category, description, text))
    if stay.condition is not None:
        for _ in range(int(rng.integers(1, 3))):
            when = stay.admit_time + (stay.discharge_time - stay.admit_time) * float(rng.random())
            notes.append(_note(subject_id, hadm_id, when, when, "Radiology", "CHEST (PORTABLE AP)", _radiology(rng)))
        if rng.random() < 0.6:  # ECG reports have a CHARTDATE but no CHARTTIME in MIMIC-III
            notes.append(_note(subject_id, hadm_id, stay.admit_time, None, "ECG", "Report",
                               _pick(rng, ["Sinus rhythm. Left axis deviation. Nonspecific ST-T wave changes.",
                                           "Sinus tachycardia. Otherwise normal ECG.",
                                           "Atrial fibrillation with rapid ventricular response."])))
    notes.append(_note(subject_id, hadm_id, stay.discharge_time, None, "Discharge summary", "Report",
                       _discharge_summary(rng, stay)))
    if rng.random() < 0.05:  # an addendum: ClinicalBERT keeps the last summary, which is then this
        notes.append(_note(subject_id, hadm_id, stay.discharge_time, None, "Discharge summary", "Addendum",
                           f"Addendum:\nPlease note the follow up appointment with Dr. [**Last Name (STitle) **] "
                           f"was changed. {_risk_sentences(rng, stay.risk, 1.0)}"))
    return notes


def _note(subject_id: int, hadm_id: int, chart_day: datetime, chart_time: datetime | None, category: str,
          description: str, text: str) -> list:
    time = chart_time.strftime(_TIME) if chart_time else ""
    caregiver = 14000 + hadm_id % 7000 if chart_time else ""  # MIMIC-III leaves CGID empty without a CHARTTIME
    return ["", subject_id, hadm_id, chart_day.strftime("%Y-%m-%d"), time, time, category, description,
            caregiver, "", f"{GENERATED_MARK}\n{text}\n"]


def _progress_note(rng, stay: _Stay, day: int) -> str:
    if stay.condition is None:
        return (f"Neonatology nursing note day {day + 1}. Infant feeding well, voiding and stooling. "
                "Temp stable in open crib.")
    lines = [f"{stay.condition[0].lower()} day {day + 1}.", "Assessment and plan:"]
    lines += _fillers(rng, int(rng.integers(4, 10)))
    lines.append(_risk_sentences(rng, stay.risk, 0.25))  # weaker signal early in the stay
    return "\n".join(line for line in lines if line)


def _radiology(rng) -> str:
    return (f"[**Hospital 93**] MEDICAL CONDITION: evaluate for effusion.\n"
            f"FINDINGS: {_pick(rng, ['Mild', 'No', 'Small'])} bilateral pleural effusions. "
            f"Heart size is {_pick(rng, ['normal', 'mildly enlarged'])}. No pneumothorax.\nIMPRESSION: as above.")


def _discharge_summary(rng, stay: _Stay) -> str:
    """A discharge summary with MIMIC-III's sections, de-identification brackets and numbered lists."""
    dates = (f"Admission Date:  {_bracket_date(stay.admit_time)}     "
             f"Discharge Date:  {_bracket_date(stay.discharge_time)}")
    if stay.condition is None:
        return (f"{dates}\nService: NB\n"
                "HISTORY: Term infant born by spontaneous vaginal delivery at [**Hospital1 18**].\n"
                "DISCHARGE DISPOSITION: Home with parents.\nFOLLOW UP: pediatrician [**Last Name (NamePattern1) **].")
    diagnosis, complaint, service, _ = stay.condition
    course = _fillers(rng, int(rng.integers(10, 40)) + 10 * (stay.discharge_time - stay.admit_time).days)
    medications = [_MEDICATIONS[i] for i in rng.permutation(len(_MEDICATIONS))[:int(rng.integers(4, 12))]]
    if stay.died:
        disposition = "Expired"
    elif rng.random() < _sigmoid(-0.6 + 0.9 * stay.risk):
        disposition = "Home"
    else:
        disposition = _pick(rng, ["Home With Service", "Extended Care"])
    history = [_CONDITIONS[j][0].lower() for j in rng.permutation(len(_CONDITIONS))[:3]]
    sections = [
        dates,
        f"Date of Birth:  [**{stay.admit_time.year - int(rng.integers(30, 90))}-3-2**]     "
        f"Sex:   {_pick(rng, ['M', 'F'])}",
        f"Service: {service}",
        "Allergies:\nPatient recorded as having No Known Allergies to Drugs",
        "Attending:[**First Name3 (LF) 1234**]",
        f"Chief Complaint:\n{complaint}",
        f"History of Present Illness:\n{int(rng.integers(40, 90))} year old with {diagnosis.lower()} who presented to "
        f"[**Hospital1 18**] with {complaint}. {_risk_sentences(rng, stay.risk, 0.8)} "
        + " ".join(_fillers(rng, 3)),
        "Past Medical History:\n" + "\n".join(f"{i}. {condition}" for i, condition in enumerate(history, 1)),
        "Social History:\nLives in [**Location (un) 86**]. "
        + _pick(rng, ["Former smoker.", "Never smoker.", "Quit tobacco 10 years ago."]),
        _exam_and_labs(rng, stay),
        f"Brief Hospital Course:\n# {diagnosis.lower()}: " + " ".join(course) + " "
        + _risk_sentences(rng, stay.risk, 1.2),  # the strongest signal: what happened and how it ended
        "Medications on Admission:\n" + "\n".join(f"{i}. {m}" for i, m in enumerate(medications[:-1], 1)),
        "Discharge Medications:\n" + "\n".join(f"{i}. {m}\nDisp:*30 Tablet(s)* Refills:*2*"
                                               for i, m in enumerate(medications, 1)),
        f"Discharge Disposition:\n{disposition}",
        "Facility:\n[**Location (un) 86**] VNA" if disposition == "Home With Service" else "",
        f"Discharge Diagnosis:\nPrimary: {diagnosis.lower()}",
        "Discharge Condition:\nMental Status: Clear and coherent. Activity Status: Ambulatory - requires assistance.",
        f"Discharge Instructions:\nYou were admitted with {complaint}. " + _risk_sentences(rng, stay.risk, 0.8),
        "Followup Instructions:\nProvider: [**First Name11 (Name Pattern1) **] [**Last Name (NamePattern4) **], MD "
        "Phone:[**Telephone/Fax (1) 250**] Date/Time:[**2151-8-1**] 2:30",
        "[**First Name8 (NamePattern2) **] [**Last Name (NamePattern1) **] MD [**MD Number(1) 1234**]",
    ]
    return "\n\n".join(section for section in sections if section)


def _exam_and_labs(rng, stay: _Stay) -> str:
    day = _bracket_date(stay.admit_time)
    return (f"Physical Exam:\nVS: T {rng.uniform(97, 101):.1f} BP {int(rng.integers(100, 170))}/"
            f"{int(rng.integers(55, 95))} HR {int(rng.integers(60, 120))} RR {int(rng.integers(14, 26))} "
            f"O2 {int(rng.integers(88, 100))}% RA\n\n"
            f"Pertinent Results:\n{day} 05:40PM BLOOD WBC-{rng.uniform(4, 18):.1f} Hgb-{rng.uniform(8, 15):.1f} "
            f"Hct-{rng.uniform(25, 45):.1f} Plt Ct-{int(rng.integers(100, 400))}\n"
            f"{day} 05:40PM BLOOD Glucose-{int(rng.integers(70, 300))} UreaN-{int(rng.integers(8, 60))} "
            f"Creat-{rng.uniform(0.6, 3.5):.1f} Na-{int(rng.integers(128, 145))} K-{rng.uniform(3.2, 5.4):.1f}")


def _bracket_date(when: datetime) -> str:
    """A date as MIMIC-III de-identifies it: [**2151-7-16**], no zero padding."""
    return f"[**{when.year}-{when.month}-{when.day}**]"


def _risk_sentences(rng, risk: float, strength: float) -> str:
    """Risk phrases that show up more, and protective ones less, the higher the risk."""
    risky = rng.random(len(_RISK_PHRASES)) < _sigmoid(-2.2 + strength * 1.2 * risk)
    protective = rng.random(len(_PROTECTIVE_PHRASES)) < _sigmoid(-1.8 - strength * 1.2 * risk)
    phrases = [p for p, keep in zip(_RISK_PHRASES, risky) if keep]
    phrases += [p for p, keep in zip(_PROTECTIVE_PHRASES, protective) if keep]
    return " ".join(f"{phrases[i][0].upper()}{phrases[i][1:]}." for i in rng.permutation(len(phrases)))


def _fillers(rng, count: int) -> list[str]:
    return [_FILLER[i] for i in rng.integers(len(_FILLER), size=count)]


def _inject_errors(admissions: list, notes: list, n_patients: int, last_hadm_id: int) -> dict[str, int]:
    """Append the bad rows that `prepare` must count, each for a new patient so no label changes."""
    good_note = notes[0]
    unknown = list(good_note)
    unknown[2] = last_hadm_id + 1000  # no such admission
    no_admission = list(good_note)
    no_admission[2] = ""  # outpatient notes in MIMIC-III have no HADM_ID
    bad_date = list(good_note)
    bad_date[3] = "2151-02-30"
    bad_admission = list(admissions[-1])
    bad_admission[1:5] = [n_patients + 1, last_hadm_id + 1, "2151-13-45 25:61:00", bad_admission[4]]
    silent = list(admissions[-1])
    silent[1:3] = [n_patients + 2, last_hadm_id + 2]
    silent[5:9] = ["", "EMERGENCY", silent[7], "HOME"]  # alive and not newborn: reaches the cohort, has no notes
    admissions.extend([bad_admission, silent])
    notes.extend([unknown, no_admission, bad_date])
    return {"notes_unknown_hadm_id": 1, "notes_without_hadm_id": 1, "notes_bad_date": 1,
            "admissions_bad_date": 1, "admissions_without_notes": 1}


def _write(path: Path, header: tuple[str, ...], rows: list[list]) -> None:
    with replaced_file(path) as temporary, open(temporary, "w", encoding="utf-8", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(header)
        for row_id, row in enumerate(rows, start=1):
            writer.writerow([row_id, *row[1:]])


def _pick(rng: np.random.Generator, options: list):
    return options[int(rng.integers(len(options)))]


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))
