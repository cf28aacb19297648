window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var badImgs = imgs.filter(function (im) { return !(im.complete && im.naturalWidth > 0); });
  var svgs = Array.prototype.slice.call(document.querySelectorAll("figure svg"));
  var flat = svgs.filter(function (s) { var r = s.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); });
  document.body.dataset.imagesOk = (badImgs.length === 0 && flat.length === 0) ? "yes" : "no";
  document.body.dataset.imgCount = String(imgs.length);
  document.body.dataset.svgCount = String(svgs.length);
});
