//! Default resource names of methods: `module::Type::method`, so two types' `get` methods in one module do not
//! collide. With `#[sentinel_resource]` on the impl block the type is the one written in the impl and the name
//! is known at compile time; without it the type comes from `Self` at the method's first call.

mod common;

use common::{engine, AppError};
use sentinel_runtime::flow::FlowRule;
use sentinel_runtime::{sentinel_resource, Sentinel};

mod shop {
    use super::AppError;
    use sentinel_runtime::sentinel_resource;

    pub struct Orders;
    pub struct Users;
    pub struct Cache<K>(pub K);

    // Named after the impl's type at compile time.
    #[sentinel_resource]
    impl Orders {
        #[sentinel_resource]
        pub fn get(&self, id: u64) -> Result<String, AppError> {
            Ok(format!("order {id}"))
        }

        #[sentinel_resource]
        pub async fn list(&self) -> Result<usize, AppError> {
            Ok(3)
        }

        // An associated function (no receiver) is named after the type too.
        #[sentinel_resource]
        pub fn open() -> Result<Orders, AppError> {
            Ok(Orders)
        }

        // An explicit name wins; items without the attribute are left alone.
        #[sentinel_resource(name = "shop.orders.count")]
        pub fn count(&self) -> Result<usize, AppError> {
            Ok(Self::helper())
        }

        fn helper() -> usize {
            7
        }
    }

    #[sentinel_resource]
    impl<K: Clone> Cache<K> {
        #[sentinel_resource]
        pub fn get(&self) -> Result<K, AppError> {
            Ok(self.0.clone())
        }
    }

    // No attribute on the impl: the method is named from `Self` when it first runs.
    impl Users {
        #[sentinel_resource]
        pub fn get(&self, id: u64) -> Result<String, AppError> {
            Ok(format!("user {id}"))
        }

        #[sentinel_resource]
        pub fn create(name: &str) -> Result<Self, AppError> {
            let _ = name;
            Ok(Users)
        }
    }

    pub trait Lookup {
        fn lookup(&self) -> Result<u8, AppError>;
    }

    #[sentinel_resource]
    impl Lookup for Users {
        #[sentinel_resource]
        fn lookup(&self) -> Result<u8, AppError> {
            Ok(1)
        }
    }
}

use shop::{Cache, Lookup, Orders, Users};

#[sentinel_resource]
fn free_function() -> Result<u8, AppError> {
    Ok(0)
}

fn names_of(engine: &Sentinel) -> Vec<String> {
    let mut v = engine.resource_names();
    v.sort();
    v
}

#[test]
fn two_types_get_methods_in_one_module_do_not_collide() {
    let (engine, _clock) = engine();
    engine
        .load_flow_rules([
            FlowRule::new("macro_methods::shop::Orders::get").count(1.0),
            FlowRule::new("macro_methods::shop::Users::get").count(2.0),
        ])
        .unwrap();
    let (orders, users) = engine.scoped(|| {
        let orders = (0..4).filter(|i| Orders.get(*i).is_ok()).count();
        let users = (0..4).filter(|i| Users.get(*i).is_ok()).count();
        (orders, users)
    });
    assert_eq!((orders, users), (1, 2), "each method is limited by the rule for its own name");
    let names = names_of(engine);
    assert!(names.contains(&"macro_methods::shop::Orders::get".to_string()), "{names:?}");
    assert!(names.contains(&"macro_methods::shop::Users::get".to_string()), "{names:?}");
}

#[test]
fn every_kind_of_method_gets_module_type_method() {
    let (engine, _clock) = engine();
    engine.scoped(|| {
        let orders = Orders::open().unwrap();
        futures::executor::block_on(orders.list()).unwrap();
        orders.count().unwrap();
        Cache(5u8).get().unwrap();
        Cache("k".to_string()).get().unwrap();
        Users::create("x").unwrap();
        Users.lookup().unwrap();
        free_function().unwrap();
    });
    let names = names_of(engine);
    for expected in [
        "macro_methods::shop::Orders::open",
        "macro_methods::shop::Orders::list",
        "shop.orders.count",
        "macro_methods::shop::Cache::get",
        "macro_methods::shop::Users::create",
        "macro_methods::shop::Users::lookup",
        "macro_methods::free_function",
    ] {
        assert!(names.contains(&expected.to_string()), "missing {expected}: {names:?}");
    }
    assert_eq!(names.iter().filter(|n| n.contains("Cache")).count(), 1, "one resource for every `K`");
}

#[test]
fn the_registry_knows_impl_named_methods_at_link_time_and_self_named_ones_after_their_first_call() {
    let registered = Sentinel::registered_resources();
    let find = |name: &str| registered.iter().find(|d| d.name == name).copied();
    let orders_get = find("macro_methods::shop::Orders::get").expect("named at compile time");
    assert!(!orders_get.named_at_first_call());
    assert_eq!(orders_get.function, "get");
    assert!(find("macro_methods::shop::Cache::get").is_some());

    // `Users::get` of an impl without the attribute: a placeholder until it runs, then its name.
    let (engine, _clock) = engine();
    engine.scoped(|| Users.get(1).unwrap());
    let after = Sentinel::registered_resources();
    let users_get = after.iter().find(|d| d.name == "macro_methods::shop::Users::get").expect("named after a call");
    assert!(!users_get.named_at_first_call());
    assert_eq!(users_get.module_path, "macro_methods::shop");
}

#[test]
fn a_rule_for_a_method_not_yet_called_is_not_reported_as_unknown() {
    let (engine, _clock) = engine();
    engine.load_flow_rules([FlowRule::new("macro_methods::shop::Users::create").count(5.0)]).unwrap();
    let unknown = engine.unknown_rule_resources();
    assert!(unknown.iter().all(|u| u.resource != "macro_methods::shop::Users::create"), "{unknown:?}");
    engine.load_flow_rules([FlowRule::new("macro_methods::shop::Userz::get::x").count(5.0)]).unwrap();
    assert!(engine.unknown_rule_resources().iter().any(|u| u.resource == "macro_methods::shop::Userz::get::x"));
}
