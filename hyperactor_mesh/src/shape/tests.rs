//! Unit tests of the shape algebra: every operation and every error, plus
//! property-style checks against a naive model (see [`Naive`]).

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use super::*;

fn extent(labels: &[&str], sizes: &[usize]) -> Extent {
    Extent::new(labels.iter().copied(), sizes.iter().copied()).unwrap()
}

fn shape(labels: &[&str], sizes: &[usize]) -> Shape {
    Shape::new(
        labels.iter().copied(),
        Slice::new_row_major(sizes.to_vec()).unwrap(),
    )
    .unwrap()
}

fn hash_of<T: Hash>(value: &T) -> u64 {
    let mut h = DefaultHasher::new();
    value.hash(&mut h);
    h.finish()
}

fn json_roundtrip<T: serde::Serialize + serde::de::DeserializeOwned>(value: &T) -> T {
    serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap()
}

// --- Extent ---------------------------------------------------------------------------------

#[test]
fn extent_accessors() {
    let e = extent(&["hosts", "gpus"], &[2, 4]);
    assert_eq!(e.labels(), ["hosts", "gpus"]);
    assert_eq!(e.sizes(), [2, 4]);
    assert_eq!((e.num_dims(), e.num_ranks()), (2, 8));
    assert_eq!((e.position("gpus"), e.position("x")), (Some(1), None));
    assert!(e.contains("hosts") && !e.contains("nodes"));
    assert_eq!((e.dim("gpus").unwrap(), e.size("gpus").unwrap()), (1, 4));
    assert_eq!(e.iter().collect::<Vec<_>>(), [("hosts", 2), ("gpus", 4)]);
    assert_eq!(e.to_string(), "{'hosts': 2, 'gpus': 4}");
    assert_eq!(
        format!("{e:?}"),
        r#"Extent { labels: ["hosts", "gpus"], sizes: [2, 4] }"#
    );
}

#[test]
fn extent_unity_and_empty() {
    let unity = Extent::unity();
    assert_eq!((unity.num_dims(), unity.num_ranks()), (0, 1));
    assert_eq!(unity, extent(&[], &[]));
    assert_eq!(unity.to_string(), "{}");
    assert_eq!(unity.points().map(|p| p.rank()).collect::<Vec<_>>(), [0]);
    let empty = extent(&["a", "b"], &[3, 0]);
    assert_eq!(empty.num_ranks(), 0);
    assert_eq!(empty.points().count(), 0);
    assert!(empty.region().is_empty());
}

#[test]
fn extent_errors() {
    let err = Extent::new(["a", "b"], [1]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "got 2 labels ['a', 'b'] but 1 sizes [1]; pass exactly one size per label"
    );
    let err = Extent::new(["b", "a", "b", "a", "c"], [1, 1, 1, 1, 1]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::DuplicateLabel {
            duplicates: vec!["a".into(), "b".into()],
            labels: ["b", "a", "b", "a", "c"].map(String::from).to_vec(),
        }
    );
    assert!(err
        .to_string()
        .starts_with("duplicate dimension label(s) ['a', 'b'] in"));
    // Many labels take the sorted path.
    let many: Vec<String> = (0..20).map(|i| format!("d{}", i % 19)).collect();
    let err = Extent::new(many, vec![1; 20]).unwrap_err();
    assert!(
        matches!(err, ShapeError::DuplicateLabel { ref duplicates, .. } if duplicates == &["d0"])
    );
    let distinct: Vec<String> = (0..20).map(|i| format!("d{i}")).collect();
    assert_eq!(Extent::new(distinct, vec![1; 20]).unwrap().num_ranks(), 1);
    let err = Extent::new(["a", "b"], [usize::MAX, 2]).unwrap_err();
    assert!(matches!(err, ShapeError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("use smaller sizes"));
    // Huge sizes are fine when another size is 0: there are no ranks.
    assert_eq!(
        Extent::new(["a", "b", "c"], [usize::MAX, usize::MAX, 0])
            .unwrap()
            .num_ranks(),
        0
    );
}

#[test]
fn extent_unknown_dimension() {
    let e = extent(&["hosts"], &[2]);
    let err = e.size("gpus").unwrap_err();
    assert_eq!(
        err,
        ShapeError::UnknownDimension {
            label: "gpus".into(),
            labels: vec!["hosts".into()]
        }
    );
    assert_eq!(
        err.to_string(),
        "no such dimension: there is no dimension 'gpus'; expected one of ['hosts']"
    );
    assert!(matches!(
        e.dim("x"),
        Err(ShapeError::UnknownDimension { .. })
    ));
}

#[test]
fn extent_points() {
    let e = extent(&["hosts", "gpus"], &[2, 3]);
    let points: Vec<Point> = e.points().collect();
    assert_eq!(points.len(), 6);
    for (rank, p) in points.iter().enumerate() {
        assert_eq!(p.rank(), rank);
        assert_eq!(p.coords(), [rank / 3, rank % 3]);
        assert_eq!(&e.point(rank).unwrap(), p);
        assert_eq!(&e.point_at(&p.coords()).unwrap(), p);
    }
    let err = e.point(6).unwrap_err();
    assert_eq!(
        err.to_string(),
        "rank 6 is out of range for extent {'hosts': 2, 'gpus': 3}, which has 6 point(s); \
         expected 0 <= rank < 6"
    );
    for bad in [&[2, 0][..], &[0, 3], &[0], &[0, 0, 0]] {
        let err = e.point_at(bad).unwrap_err();
        assert!(
            matches!(err, ShapeError::CoordinatesOutOfRange { .. }),
            "{bad:?}"
        );
        assert!(err
            .to_string()
            .starts_with(&format!("coordinates {bad:?} are not a point")));
    }
}

#[test]
fn extent_region() {
    let region = extent(&["a", "b"], &[2, 3]).region();
    assert_eq!(region.labels(), ["a", "b"]);
    assert_eq!(region.ranks(), (0..6).collect::<Vec<_>>());
    assert_eq!(region.slice(), &Slice::new_row_major(vec![2, 3]).unwrap());
    assert_eq!(Extent::unity().region(), Shape::unity());
}

#[test]
fn extent_equality_is_ordered_and_by_content() {
    let a = extent(&["hosts", "gpus"], &[2, 4]);
    let b = extent(&["hosts", "gpus"], &[2, 4]);
    assert_eq!(a, b);
    assert_eq!(a, a.clone());
    assert_eq!(hash_of(&a), hash_of(&b));
    assert_ne!(a, extent(&["gpus", "hosts"], &[4, 2]));
    assert_ne!(a, extent(&["hosts", "gpus"], &[2, 5]));
}

#[test]
fn labels_are_quoted_like_python() {
    let e = extent(&["it's", "a\\b", "tab\t", "q'\""], &[1, 1, 1, 1]);
    assert_eq!(
        e.to_string(),
        r#"{"it's": 1, 'a\\b': 1, 'tab\t': 1, 'q\'"': 1}"#
    );
}

#[test]
fn extent_serde_roundtrip_and_validation() {
    let e = extent(&["hosts", "gpus"], &[2, 4]);
    assert_eq!(
        serde_json::to_string(&e).unwrap(),
        r#"{"labels":["hosts","gpus"],"sizes":[2,4]}"#
    );
    assert_eq!(json_roundtrip(&e), e);
    let bad = r#"{"labels":["a","a"],"sizes":[1,2]}"#;
    let err = serde_json::from_str::<Extent>(bad).unwrap_err();
    assert!(
        err.to_string().contains("duplicate dimension label"),
        "{err}"
    );
    assert!(serde_json::from_str::<Extent>(r#"{"labels":["a"],"sizes":[]}"#).is_err());
}

// --- Point ----------------------------------------------------------------------------------

#[test]
fn point_coordinates() {
    let e = extent(&["hosts", "gpus"], &[2, 4]);
    let p = Point::new(e.clone(), 6).unwrap();
    assert_eq!((p.rank(), p.extent(), p.num_dims()), (6, &e, 2));
    assert_eq!(p.coords(), [1, 2]);
    assert_eq!(
        (p.coord("hosts").unwrap(), p.coord("gpus").unwrap()),
        (1, 2)
    );
    assert_eq!(
        (p.coord_at(0), p.coord_at(1), p.coord_at(2)),
        (Some(1), Some(2), None)
    );
    assert_eq!(p.iter().collect::<Vec<_>>(), [("hosts", 1), ("gpus", 2)]);
    assert_eq!(p.to_string(), "{'hosts': 1/2, 'gpus': 2/4}");
    assert!(format!("{p:?}").starts_with("Point { rank: 6, extent: Extent {"));
    let err = p.coord("nodes").unwrap_err();
    assert!(err.to_string().contains("no dimension 'nodes'"));
}

#[test]
fn point_zero_dimensional() {
    let p = Point::new(Extent::unity(), 0).unwrap();
    assert_eq!(
        (p.rank(), p.coords(), p.to_string()),
        (0, vec![], "{}".to_string())
    );
    assert!(Point::new(Extent::unity(), 1).is_err());
}

#[test]
fn point_out_of_range() {
    let err = Point::new(extent(&["hosts"], &[2]), 2).unwrap_err();
    assert!(matches!(err, ShapeError::RankOutOfRange { rank: 2, .. }));
    assert!(Point::new(extent(&["a"], &[0]), 0).is_err());
}

#[test]
fn point_eq_hash_serde() {
    let p = Point::new(extent(&["a", "b"], &[2, 2]), 3).unwrap();
    let q = Point::new(extent(&["a", "b"], &[2, 2]), 3).unwrap();
    assert_eq!((p.clone(), hash_of(&p)), (q, hash_of(&p)));
    assert_ne!(p, Point::new(extent(&["a", "b"], &[4, 1]), 3).unwrap());
    assert_eq!(json_roundtrip(&p), p);
    let bad = r#"{"extent":{"labels":["a"],"sizes":[2]},"rank":2}"#;
    let err = serde_json::from_str::<Point>(bad).unwrap_err();
    assert!(err.to_string().contains("rank 2 is out of range"), "{err}");
}

// --- Slice ----------------------------------------------------------------------------------

#[test]
fn slice_row_major() {
    let s = Slice::new_row_major(vec![2, 3]).unwrap();
    assert_eq!(
        (s.offset(), s.sizes(), s.strides()),
        (0, &[2, 3][..], &[3, 1][..])
    );
    assert_eq!(
        (s.len(), s.num_dims(), s.is_empty(), s.is_dense()),
        (6, 2, false, true)
    );
    assert_eq!(s.ranks(), (0..6).collect::<Vec<_>>());
    let at = Slice::new_row_major_at(8, vec![2, 4]).unwrap();
    assert_eq!(at.ranks()[..3], [8, 9, 10]);
    // A size-0 dimension counts as 1 in the strides of the dimensions before it.
    assert_eq!(
        Slice::new_row_major(vec![2, 0, 3]).unwrap().strides(),
        [3, 3, 1]
    );
    assert_eq!(Slice::new_row_major(vec![]).unwrap().ranks(), [0]);
}

#[test]
fn slice_strided() {
    let s = Slice::new(1, vec![2, 2], vec![4, 2]).unwrap();
    assert_eq!(s.ranks(), [1, 3, 5, 7]);
    assert_eq!(
        (0..4).map(|i| s.get(i).unwrap()).collect::<Vec<_>>(),
        s.ranks()
    );
    assert_eq!(
        s.ranks()
            .iter()
            .map(|&r| s.index(r).unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    assert!(s.contains(5) && !s.contains(4) && !s.contains(0) && !s.contains(9));
    assert!(!s.is_dense());
    assert_eq!((&s).into_iter().len(), 4);
    assert_eq!(
        s.to_string(),
        "Slice(offset=1, sizes=[2, 2], strides=[4, 2])"
    );
    let err = s.get(4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "local index 4 is out of range for a view of 4 rank(s); expected 0 <= index < 4"
    );
    let err = s.index(4).unwrap_err();
    assert_eq!(
        err.to_string(),
        "global rank 4 is not in Slice(offset=1, sizes=[2, 2], strides=[4, 2]), which covers \
         [1, 3, 5, 7]; pass one of those ranks"
    );
}

#[test]
fn slice_rank_not_in_slice_lists_at_most_16_ranks() {
    let s = Slice::new_row_major(vec![40]).unwrap();
    let err = s.index(40).unwrap_err().to_string();
    assert!(
        err.contains("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, ... (40 in all)]"),
        "{err}"
    );
}

#[test]
fn slice_index_of_non_nested_slices_searches() {
    let column_major = Slice::new(0, vec![2, 2], vec![1, 2]).unwrap();
    assert_eq!(column_major.ranks(), [0, 2, 1, 3]);
    assert_eq!(
        [0, 2, 1, 3].map(|r| column_major.index(r).unwrap()),
        [0, 1, 2, 3]
    );
    assert!(!column_major.contains(4));
    // Overlapping: the first local index wins.
    let overlapping = Slice::new(0, vec![2, 2], vec![1, 1]).unwrap();
    assert_eq!(overlapping.ranks(), [0, 1, 1, 2]);
    assert_eq!(overlapping.index(1).unwrap(), 1);
}

#[test]
fn slice_is_dense() {
    assert!(Slice::new(3, vec![1, 4], vec![100, 1]).unwrap().is_dense());
    assert!(Slice::new(0, vec![2, 1, 3], vec![3, 7, 1])
        .unwrap()
        .is_dense());
    assert!(!Slice::new(0, vec![2, 2], vec![4, 1]).unwrap().is_dense());
    assert!(Slice::new(0, vec![0, 2], vec![9, 9]).unwrap().is_dense());
    let empty = Slice::new(5, vec![3, 0], vec![1, 1]).unwrap();
    assert!(empty.is_empty() && empty.ranks().is_empty() && !empty.contains(5));
    assert!(empty.get(0).is_err());
}

#[test]
fn slice_errors() {
    let err = Slice::new(0, vec![1, 2], vec![1]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "got 2 sizes [1, 2] but 1 strides [1]; pass one stride per size"
    );
    let err = Slice::new(0, vec![1], vec![0]).unwrap_err();
    assert_eq!(err, ShapeError::ZeroStride { strides: vec![0] });
    assert!(err.to_string().starts_with("strides must be >= 1, got [0]"));
    let too_far = Slice::new(usize::MAX - 1, vec![3], vec![1]).unwrap_err();
    assert!(matches!(too_far, ShapeError::TooLarge { .. }));
    let too_many = Slice::new(0, vec![1 << 40, 1 << 40], vec![1, 1]).unwrap_err();
    assert!(matches!(too_many, ShapeError::TooLarge { .. }));
    assert!(Slice::new_row_major(vec![usize::MAX, 2]).is_err());
    // The largest rank may be usize::MAX itself.
    assert_eq!(
        Slice::new(usize::MAX, vec![1], vec![1]).unwrap().ranks(),
        [usize::MAX]
    );
    // No ranks, no limit.
    assert!(Slice::new(usize::MAX, vec![0, 9], vec![usize::MAX, usize::MAX]).is_ok());
}

#[test]
fn slice_eq_hash_serde() {
    let s = Slice::new(3, vec![2], vec![5]).unwrap();
    assert_eq!(json_roundtrip(&s), s);
    assert_eq!(hash_of(&s), hash_of(&s.clone()));
    assert_ne!(s, Slice::new_row_major_at(3, vec![2]).unwrap());
    let bad = r#"{"offset":0,"sizes":[2],"strides":[0]}"#;
    assert!(serde_json::from_str::<Slice>(bad).is_err());
}

// --- Shape ----------------------------------------------------------------------------------

#[test]
fn shape_basics() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    assert_eq!(s.extent(), extent(&["hosts", "gpus"], &[2, 4]));
    assert_eq!((s.len(), s.num_dims(), s.is_empty()), (8, 2, false));
    assert_eq!(s.ranks(), (0..8).collect::<Vec<_>>());
    assert_eq!(s.iter().collect::<Vec<_>>(), s.ranks());
    assert_eq!((s.dim("gpus").unwrap(), s.size("gpus").unwrap()), (1, 4));
    assert!(s.size("x").is_err());
    assert_eq!(
        s.coordinates(6).unwrap(),
        Point::new(s.extent(), 6).unwrap()
    );
    assert_eq!(Shape::unity().ranks(), [0]);
    assert_eq!(Shape::unity().extent(), Extent::unity());
    assert_eq!(
        s.to_string(),
        "Shape(labels=['hosts', 'gpus'], slice=Slice(offset=0, sizes=[2, 4], strides=[4, 1]))"
    );
    assert_eq!(json_roundtrip(&s), s);
    assert_eq!(hash_of(&s), hash_of(&shape(&["hosts", "gpus"], &[2, 4])));
}

#[test]
fn shape_errors() {
    let err = Shape::new(["a"], Slice::new_row_major(vec![1, 2]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("one size per label"), "{err}");
    let err = Shape::new(["a", "a"], Slice::new_row_major(vec![1, 2]).unwrap()).unwrap_err();
    assert!(err.to_string().contains("duplicate"), "{err}");
    let bad = r#"{"labels":["a","a"],"slice":{"offset":0,"sizes":[1,1],"strides":[1,1]}}"#;
    assert!(serde_json::from_str::<Shape>(bad).is_err());
}

#[test]
fn shape_coordinates_are_relative_to_the_view() {
    let view = shape(&["gpus"], &[8])
        .select_range("gpus", 4, 8, 1)
        .unwrap();
    assert_eq!(view.coordinates(6).unwrap().to_string(), "{'gpus': 2/4}");
    assert!(matches!(
        view.coordinates(3),
        Err(ShapeError::RankNotInSlice { rank: 3, .. })
    ));
}

#[test]
fn select_removes_the_dimension() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    let row = s.select("hosts", 1).unwrap();
    assert_eq!(
        (row.labels(), row.ranks()),
        (&["gpus".to_string()][..], vec![4, 5, 6, 7])
    );
    let one = row.select("gpus", 2).unwrap();
    assert_eq!((one.num_dims(), one.ranks()), (0, vec![6]));
    let err = s.select("hosts", 2).unwrap_err();
    assert_eq!(
        err.to_string(),
        "index 2 is out of range for dimension 'hosts' of size 2; expected 0 <= hosts < 2"
    );
    assert!(s
        .select("nodes", 0)
        .unwrap_err()
        .to_string()
        .contains("no such dimension"));
}

#[test]
fn select_range_keeps_the_dimension() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    let odd = s.select_range("gpus", 1, 4, 2).unwrap();
    assert_eq!((odd.labels(), odd.ranks()), (s.labels(), vec![1, 3, 5, 7]));
    let uneven = shape(&["gpus"], &[5])
        .select_range("gpus", 0, 5, 2)
        .unwrap();
    assert_eq!(uneven.ranks(), [0, 2, 4]);
    let empty = s.select_range("gpus", 3, 1, 1).unwrap();
    assert_eq!((empty.len(), empty.extent().sizes()), (0, &[2, 0][..]));
    assert_eq!(s.select_range("gpus", 4, 4, 1).unwrap().len(), 0);
    let err = s.select_range("gpus", 0, 5, 1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "range 0..5 is out of bounds for dimension 'gpus' of size 4; expected start <= 4 and \
         stop <= 4"
    );
    let err = s.select_range("gpus", 0, 4, 0).unwrap_err();
    assert!(err.to_string().contains("steps must be positive"), "{err}");
    assert!(s.select_range("x", 0, 1, 1).is_err());
}

#[test]
fn select_of_a_select() {
    let s = shape(&["hosts", "gpus"], &[4, 8]);
    let view = s
        .select_range("hosts", 1, 4, 1)
        .unwrap()
        .select_range("gpus", 1, 8, 2)
        .unwrap();
    assert_eq!(
        view.ranks(),
        [9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31]
    );
    let inner = view
        .select_range("hosts", 1, 3, 1)
        .unwrap()
        .select_range("gpus", 2, 4, 1)
        .unwrap();
    assert_eq!(inner.extent().sizes(), [2, 2]);
    assert_eq!(inner.ranks(), [21, 23, 29, 31]);
    assert_eq!(
        inner
            .select("hosts", 1)
            .unwrap()
            .select("gpus", 0)
            .unwrap()
            .ranks(),
        [29]
    );
}

#[test]
fn split_infers_one_size() {
    let s = shape(&["hosts", "gpus"], &[4, 8]);
    let spec = SplitSpec::new()
        .split("hosts", ["dp", "pp"])
        .split("gpus", ["tp"])
        .size("pp", 2);
    assert_eq!(spec.splits().len(), 2);
    assert_eq!(spec.sizes(), [("pp".to_string(), 2)]);
    let split = s.split(&spec).unwrap();
    assert_eq!(split.extent(), extent(&["dp", "pp", "tp"], &[2, 2, 8]));
    assert_eq!(split.ranks(), (0..32).collect::<Vec<_>>());
    assert_eq!(split.slice().strides(), [16, 8, 1]);
}

#[test]
fn split_with_every_size_and_of_a_strided_view() {
    let s = shape(&["gpus"], &[8]);
    let spec = SplitSpec::new()
        .split("gpus", ["a", "b", "c"])
        .size("a", 2)
        .size("b", 2)
        .size("c", 2);
    let split = s.split(&spec).unwrap();
    assert_eq!(split.select("b", 1).unwrap().ranks(), [2, 3, 6, 7]);
    let strided = s.select_range("gpus", 1, 8, 2).unwrap();
    let split = strided
        .split(&SplitSpec::new().split("gpus", ["a", "b"]).size("b", 2))
        .unwrap();
    assert_eq!(
        (split.extent().sizes(), split.ranks()),
        (&[2, 2][..], vec![1, 3, 5, 7])
    );
    assert_eq!(split.select("a", 1).unwrap().ranks(), [5, 7]);
}

#[test]
fn split_errors() {
    let s = shape(&["hosts", "gpus"], &[4, 2]);
    let hosts = || SplitSpec::new().split("hosts", ["a", "b"]);
    let cases: Vec<(SplitSpec, &str)> = vec![
        (
            hosts().size("a", 3),
            "multiply to 3, which does not divide 4",
        ),
        (hosts().size("a", 2).size("b", 3), "multiply to 6, not 4"),
        (hosts(), "only one can be inferred"),
        (
            SplitSpec::new().split("hosts", ["a"]).size("z", 2),
            "['z'] name no new dimension",
        ),
        (
            SplitSpec::new().size("hosts", 2),
            "'hosts'=2 names an existing dimension",
        ),
        (
            SplitSpec::new().split("hosts", Vec::<String>::new()),
            "at least one new name",
        ),
        (hosts().size("b", 0), "must be >= 1"),
        (
            SplitSpec::new().split("nodes", ["a", "b"]),
            "no dimension 'nodes'",
        ),
        (
            SplitSpec::new().split("hosts", ["gpus"]),
            "duplicate dimension label(s) ['gpus']",
        ),
        (
            hosts().split("hosts", ["c"]),
            "dimension 'hosts' is split twice",
        ),
        (
            hosts().size("a", 2).size("a", 2),
            "new dimension 'a' is given two sizes",
        ),
    ];
    for (spec, expected) in cases {
        let err = s.split(&spec).unwrap_err().to_string();
        assert!(err.contains(expected), "{spec:?}: {err}");
    }
}

#[test]
fn split_a_size_may_name_a_label_being_split() {
    let s = shape(&["hosts"], &[6]);
    let split = s
        .split(
            &SplitSpec::new()
                .split("hosts", ["dp", "hosts"])
                .size("hosts", 3),
        )
        .unwrap();
    assert_eq!(split.extent(), extent(&["dp", "hosts"], &[2, 3]));
}

#[test]
fn split_of_an_empty_dimension() {
    let s = shape(&["a"], &[0]);
    let split = s
        .split(&SplitSpec::new().split("a", ["x", "y"]).size("y", 3))
        .unwrap();
    assert_eq!((split.extent().sizes(), split.len()), (&[0, 3][..], 0));
}

#[test]
fn rename_relabels() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    let renamed = s.rename([("hosts", "nodes"), ("gpus", "devices")]).unwrap();
    assert_eq!(renamed.labels(), ["nodes", "devices"]);
    assert_eq!(renamed.slice(), s.slice());
    // A swap is fine: new labels are checked once every rename is applied.
    let swapped = s.rename([("hosts", "gpus"), ("gpus", "hosts")]).unwrap();
    assert_eq!(swapped.labels(), ["gpus", "hosts"]);
    assert!(s
        .rename([("nodes", "x")])
        .unwrap_err()
        .to_string()
        .contains("no such dimension"));
    assert!(matches!(
        s.rename([("hosts", "gpus")]),
        Err(ShapeError::DuplicateLabel { .. })
    ));
}

#[test]
fn flatten_dense_views() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    assert_eq!(s.flatten("r").unwrap().extent(), extent(&["r"], &[8]));
    let row = s.select("hosts", 1).unwrap().flatten("r").unwrap();
    assert_eq!(
        (row.extent().sizes(), row.ranks()),
        (&[4][..], vec![4, 5, 6, 7])
    );
    let outer = s
        .select_range("hosts", 1, 2, 1)
        .unwrap()
        .flatten("r")
        .unwrap();
    assert_eq!(outer.ranks(), [4, 5, 6, 7]);
    assert_eq!(
        Shape::unity().flatten("r").unwrap().extent(),
        extent(&["r"], &[1])
    );
    let empty = s
        .select_range("gpus", 0, 0, 1)
        .unwrap()
        .flatten("r")
        .unwrap();
    assert_eq!(empty.len(), 0);
}

#[test]
fn flatten_rejects_views_that_are_not_dense() {
    let s = shape(&["hosts", "gpus"], &[2, 4]);
    let views = [
        s.select_range("gpus", 0, 2, 1).unwrap(),
        s.select_range("gpus", 0, 4, 2).unwrap(),
        s.select("hosts", 0)
            .unwrap()
            .select_range("gpus", 0, 4, 3)
            .unwrap(),
    ];
    for view in views {
        let err = view.flatten("r").unwrap_err();
        assert!(matches!(err, ShapeError::NotDense { .. }));
        assert!(err
            .to_string()
            .starts_with("cannot flatten a view that is not dense"));
    }
}

// --- property-style checks --------------------------------------------------------------------

/// A deterministic xorshift generator: the checks below are reproducible.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A view computed the obvious way: sizes plus the global rank at every coordinate, in
/// row-major order.
#[derive(Debug, Clone)]
struct Naive {
    sizes: Vec<usize>,
    ranks: Vec<usize>,
}

impl Naive {
    fn dense(sizes: &[usize]) -> Self {
        Self {
            sizes: sizes.to_vec(),
            ranks: (0..sizes.iter().product()).collect(),
        }
    }

    /// Coordinates of each element, in row-major order.
    fn coords(&self) -> Vec<Vec<usize>> {
        (0..self.ranks.len())
            .map(|mut i| {
                let mut c = vec![0; self.sizes.len()];
                for (d, &s) in self.sizes.iter().enumerate().rev() {
                    c[d] = i % s;
                    i /= s;
                }
                c
            })
            .collect()
    }

    fn select(&self, dim: usize, index: usize) -> Self {
        let mut sizes = self.sizes.clone();
        sizes.remove(dim);
        let ranks = self
            .coords()
            .iter()
            .zip(&self.ranks)
            .filter(|(c, _)| c[dim] == index)
            .map(|(_, &r)| r)
            .collect();
        Self { sizes, ranks }
    }

    fn select_range(&self, dim: usize, start: usize, stop: usize, step: usize) -> Self {
        let keep: Vec<usize> = (start..stop).step_by(step).collect();
        let mut sizes = self.sizes.clone();
        sizes[dim] = keep.len();
        // Row-major order of the kept coordinates: enumerate the new coordinates.
        let mut out = Self {
            sizes,
            ranks: Vec::new(),
        };
        let n: usize = out.sizes.iter().product();
        out.ranks = vec![0; n];
        let old = self.coords();
        let new_coords = out.coords();
        for (i, c) in new_coords.iter().enumerate() {
            let mut oc = c.clone();
            oc[dim] = keep[c[dim]];
            let j = old.iter().position(|o| *o == oc).unwrap();
            out.ranks[i] = self.ranks[j];
        }
        out
    }
}

fn random_shape(rng: &mut Rng) -> (Vec<String>, Shape) {
    let ndims = 1 + rng.below(3);
    let sizes: Vec<usize> = (0..ndims).map(|_| 1 + rng.below(5)).collect();
    let labels: Vec<String> = (0..ndims).map(|d| format!("d{d}")).collect();
    let offset = rng.below(10);
    let slice = Slice::new_row_major_at(offset, sizes).unwrap();
    (labels.clone(), Shape::new(labels, slice).unwrap())
}

fn check_against(shape: &Shape, naive: &Naive) {
    assert_eq!(shape.extent().sizes(), naive.sizes, "{shape}");
    assert_eq!(shape.ranks(), naive.ranks, "{shape}");
    let extent = shape.extent();
    for (i, &rank) in naive.ranks.iter().enumerate() {
        assert_eq!(shape.slice().get(i).unwrap(), rank);
        assert_eq!(shape.slice().index(rank).unwrap(), i, "{shape} rank {rank}");
        let point = shape.coordinates(rank).unwrap();
        assert_eq!(point.rank(), i);
        assert_eq!(extent.point_at(&point.coords()).unwrap(), point);
    }
}

#[test]
fn random_views_match_the_naive_model() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..300 {
        let (labels, mut shape) = random_shape(&mut rng);
        let offset = shape.slice().offset();
        let mut naive = Naive::dense(shape.slice().sizes());
        naive.ranks.iter_mut().for_each(|r| *r += offset);
        let mut labels = labels;
        for _ in 0..3 {
            if labels.is_empty() {
                break;
            }
            let dim = rng.below(labels.len());
            let size = naive.sizes[dim];
            if rng.below(2) == 0 && size > 0 {
                let index = rng.below(size);
                shape = shape.select(&labels[dim], index).unwrap();
                naive = naive.select(dim, index);
                labels.remove(dim);
            } else {
                let (start, stop) = (rng.below(size + 1), rng.below(size + 1));
                let step = 1 + rng.below(3);
                shape = shape.select_range(&labels[dim], start, stop, step).unwrap();
                naive = naive.select_range(dim, start, stop, step);
            }
            check_against(&shape, &naive);
        }
    }
}

#[test]
fn random_splits_and_flattens_keep_ranks_and_order() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for _ in 0..300 {
        let (labels, shape) = random_shape(&mut rng);
        // Cut a strided view first, along a random dimension.
        let dim = rng.below(labels.len());
        let size = shape.slice().sizes()[dim];
        let step = 1 + rng.below(2);
        let view = shape.select_range(&labels[dim], 0, size, step).unwrap();
        let ranks = view.ranks();
        // Split every dimension into (outer, inner) with a random divisor as the inner.
        let mut spec = SplitSpec::new();
        for (d, label) in labels.iter().enumerate() {
            let n = view.slice().sizes()[d];
            let divisors: Vec<usize> = (1..=n).filter(|k| n % k == 0).collect();
            let inner = divisors[rng.below(divisors.len())];
            spec = spec
                .split(label, [format!("{label}o"), format!("{label}i")])
                .size(format!("{label}i"), inner);
        }
        let split = view.split(&spec).unwrap();
        assert_eq!(split.ranks(), ranks, "{view} split {spec:?}");
        assert_eq!(split.num_dims(), 2 * labels.len());
        check_against(
            &split,
            &Naive {
                sizes: split.extent().sizes().to_vec(),
                ranks: ranks.clone(),
            },
        );
        match view.flatten("all") {
            Ok(flat) => {
                assert!(view.slice().is_dense());
                assert_eq!(flat.ranks(), ranks);
            }
            Err(_) => {
                let sorted = ranks.windows(2).all(|w| w[1] == w[0] + 1);
                assert!(!sorted, "{view} is dense but flatten failed");
            }
        }
    }
}

#[test]
fn random_points_round_trip() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for _ in 0..200 {
        let ndims = rng.below(4);
        let sizes: Vec<usize> = (0..ndims).map(|_| 1 + rng.below(4)).collect();
        let labels: Vec<String> = (0..ndims).map(|d| format!("l{d}")).collect();
        let e = Extent::new(labels, sizes).unwrap();
        for rank in 0..e.num_ranks() {
            let p = e.point(rank).unwrap();
            assert_eq!(e.point_at(&p.coords()).unwrap().rank(), rank);
            let via_labels: Vec<usize> = e.labels().iter().map(|l| p.coord(l).unwrap()).collect();
            assert_eq!(via_labels, p.coords());
        }
    }
}

#[test]
fn random_slices_index_matches_search() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for _ in 0..300 {
        let ndims = 1 + rng.below(3);
        let sizes: Vec<usize> = (0..ndims).map(|_| rng.below(4)).collect();
        let strides: Vec<usize> = (0..ndims).map(|_| 1 + rng.below(6)).collect();
        let slice = Slice::new(rng.below(5), sizes, strides).unwrap();
        let ranks = slice.ranks();
        assert_eq!(ranks.len(), slice.len());
        for rank in 0..40 {
            let first = ranks.iter().position(|&r| r == rank);
            assert_eq!(slice.index(rank).ok(), first, "{slice} rank {rank}");
            assert_eq!(slice.contains(rank), first.is_some());
        }
        let dense = ranks.windows(2).all(|w| w[1] == w[0] + 1);
        assert_eq!(slice.is_dense(), dense, "{slice}");
    }
}

#[test]
fn errors_and_split_specs_serialize() {
    let err = extent(&["a"], &[2]).point(5).unwrap_err();
    assert_eq!(json_roundtrip(&err), err);
    let spec = SplitSpec::new().split("a", ["x", "y"]).size("y", 2);
    assert_eq!(json_roundtrip(&spec), spec);
}
